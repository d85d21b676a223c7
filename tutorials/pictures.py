"""The chapters' pictures, drawn from the numbers their scripts print.

    pip install -e '.[plots]'                      # matplotlib, the one optional dependency
    python -m tutorials.pictures                   # every picture, into tutorials/NN_*/pictures/
    python -m tutorials.pictures ring_steps mesh_grid --out /tmp/pictures
    python -m tutorials.pictures --text            # the text form of every picture instead
    python -m tutorials.pictures --list

One source: each picture calls the chapter script's own function — its `main` on
thread ranks, or its `simulate` — which prints the chapter's text and returns the
numbers it printed; matplotlib draws those numbers. Without matplotlib (or with
--text) the command prints the text the chapter prints for the same run instead,
so no chapter needs matplotlib. `--quick` shrinks the slow runs (training, sweeps)
for the test suite; the committed pictures are made without it.

Why a module of `tutorials/` and not of `parallel/`: a picture is teaching material
about one chapter's run, the library stays free of a plotting dependency, and what
the library does draw — `Timeline.render`, `Mesh.describe` — is the text the
scripts print and this module's fallback.
"""
import argparse
import contextlib
import importlib.util
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the thread ranks share the cores (before numpy loads)

import numpy as np  # noqa: E402

import parallel  # noqa: E402,F401  (first of the project's imports: one BLAS thread per rank)
from minitensor.data import recommended_config  # noqa: E402
from parallel.comm import run_on_ranks  # noqa: E402
from parallel.mesh import rank_of  # noqa: E402
from parallel.pipeline.timeline import LETTERS  # noqa: E402

TUTORIALS = Path(__file__).resolve().parent
DPI = 80  # small files: a few tens of KB each
COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "backward_input": "#dd8452", "backward_weight": "#55a868"}


# --- running a chapter script's function ----------------------------------------------------

def load_script(path):
    """A chapter script as a module (its folder on sys.path, as when it runs as a script)."""
    path = TUTORIALS / path
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"chapter_{path.parent.name[:2]}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def run(path, function, *args, threads=None):
    """(what it returned, what it printed) of the script's `function(*args)`, on `threads`
    thread ranks if given (rank 0's return value). Functions that take `say` get a printer."""
    fn = getattr(load_script(path), function)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = run_on_ranks(threads, fn, *args)[0] if threads else fn(*args)
    return result, printed.getvalue()


# --- the pictures -----------------------------------------------------------------------------

@dataclass
class Picture:
    name: str       # the file name (without .png) and the command-line name
    chapter: str    # its folder under tutorials/
    compute: object  # quick -> (data, the chapter's text for it)
    draw: object     # (plt, data) -> Figure


def train_loss(quick):
    """Chapter 2's training run (the default recipe; --quick: 40 steps)."""
    recipe = recommended_config()  # the script's defaults
    args = SimpleNamespace(**{k: recipe[k] for k in ("steps", "digits", "n_layer", "n_head", "d_model", "lr",
                                                      "warmup", "weight_decay", "seed")}, batch=recipe["batch_size"])
    if quick:
        args.steps = 40
    return run("02_gpt/train_addition.py", "main", args)


def draw_train_loss(plt, data):
    losses, matched = data
    fig, ax = plt.subplots(figsize=(6, 2.8))
    ax.plot(np.arange(len(losses)), losses, lw=0.8, color=COLOURS["forward"])
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="training loss (log)",
           title=f"2-digit addition: held-out exact match {matched:.0%} after {len(losses)} steps")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def ring_steps(quick):
    """Chapter 3's ring on 3 thread ranks: which contributions each chunk holds after each step."""
    return run("03_collectives/ring_allreduce.py", "main", SimpleNamespace(elements=1200), threads=3)


def draw_ring_steps(plt, data):
    states, sent = data
    n, steps = states.shape[0], states.shape[1]
    fig, axes = plt.subplots(1, steps, figsize=(1.6 * steps, 2.0))
    for step, ax in enumerate(axes):
        held = np.vectorize(lambda v: bin(int(v)).count("1"))(states[:, step])  # contributions in each cell
        ax.imshow(held, cmap="Blues", vmin=0, vmax=n + 0.5)
        for r in range(n):
            for c in range(n):
                ranks = [str(k) for k in range(n) if int(states[r, step, c]) >> k & 1]
                ax.text(c, r, "".join(ranks), ha="center", va="center", fontsize=8,
                        color="white" if held[r, c] == n else "black")
            if step:  # the chunk this rank sent to its right neighbour in this step
                ax.add_patch(plt.Rectangle((sent[r, step - 1] - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
        phase = "start" if step == 0 else ("reduce-scatter" if step <= n - 1 else "all-gather")
        ax.set_title(phase + ("" if step == 0 else f" {(step - 1) % (n - 1)}"), fontsize=8)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if step == 0 else [], fontsize=7)
    fig.suptitle("ring all-reduce: the ranks whose contribution each chunk holds (red: sent this step)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def bandwidth(quick):
    """Chapter 3's all-reduce timings on 2 thread ranks, 1 KiB to 4 MiB (--quick: 16 KiB)."""
    args = SimpleNamespace(algorithm="builtin", max_kib=16 if quick else 4096)
    return run("03_collectives/bandwidth.py", "main", args, threads=2)


def draw_bandwidth(plt, data):
    sizes, times, n = data["sizes"], data["times"], data["n"]
    model = 2 * (n - 1) * data["alpha"] + 2 * (n - 1) / n * sizes * data["beta"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.loglog(sizes, times * 1e6, "o", color=COLOURS["forward"], label="measured (median)")
    ax.loglog(sizes, model * 1e6, "-", color=COLOURS["backward"],
              label=f"α–β fit: α {data['alpha'] * 1e6:.1f} µs, 1/β {1 / data['beta'] / 1e9:.2f} GB/s")
    ax.axvline(n * data["alpha"] / data["beta"], color="grey", ls=":", label="latency = bandwidth term")
    ax.set(xlabel="message size (bytes)", ylabel="all-reduce time (µs)",
           title=f"all-reduce on {n} thread ranks\n(a shared machine: read the shape, not the speed)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def bucket_overlap(quick):
    """Chapter 4's buckets during one backward on 2 thread ranks."""
    return run("04_data_parallel/buckets_overlap.py", "main", SimpleNamespace(bucket_kib=48), threads=2)


def draw_bucket_overlap(plt, data):
    rows = data  # one row per gradient, in the order backward produced them: (name, bucket, states)
    buckets = len(rows[0][2])
    fig, ax = plt.subplots(figsize=(6, 0.45 * buckets + 1.2))
    for b in range(buckets):
        states = [cells[b] for _, _, cells in rows]
        first = next(i for i, (_, bucket, _) in enumerate(rows) if bucket == b)
        sent = next(i for i, s in enumerate(states) if s in ("SENT", "done"))
        ax.barh(b, sent - first + 1, left=first - 0.5, color="#c6d4e8", label="filling" if b == 0 else None)
        ax.barh(b, len(rows) - sent - 1, left=sent + 0.5, color=COLOURS["forward"],
                label="all-reduce in flight" if b == 0 else None)
    ax.axvline(len(rows) - 0.5, color="black", lw=1, label="backward ends")
    ax.set_yticks(range(buckets), [f"bucket {b}" for b in range(buckets)], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="gradients ready so far (backward order)",
           title="bucket overlap: each bucket's all-reduce starts while backward still runs")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def zero1_memory(quick):
    """Chapter 4's optimizer state per rank, DataParallel + AdamW vs ZeRO-1, on 2 thread ranks."""
    return run("04_data_parallel/zero1_memory.py", "main", SimpleNamespace(steps=1 if quick else 3), threads=2)


def draw_zero1_memory(plt, memory):
    ranks = np.arange(len(memory))
    fig, ax = plt.subplots(figsize=(4.5, 2.6))
    ax.bar(ranks - 0.2, memory[:, 0] / 1e3, 0.4, color=COLOURS["backward"], label="DataParallel + AdamW")
    ax.bar(ranks + 0.2, memory[:, 1] / 1e3, 0.4, color=COLOURS["forward"], label="ZeRO-1")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set(ylabel="optimizer state (kB)", title="AdamW's two moments per rank: ZeRO-1 keeps 1/n of them")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def gpipe_timelines(quick):
    """Chapter 7: GPipe simulated and measured (2 thread ranks, m = 4)."""
    trace = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pictures-gpipe.trace.json")
    (simulated, measured), text = run("07_pipelines/gpipe.py", "main", trace, threads=2)
    return [("GPipe simulated (time units)", simulated),
            ("GPipe measured, threads backend (seconds; the order is meaningful, the durations not)",
             measured)], text


def simulated_timelines(path):
    """`compute` for a script whose `simulate(say)` prints and returns [(title, Timeline)]."""
    def compute(quick):
        printed = []
        timelines = load_script(path).simulate(printed.append)
        return timelines, "\n".join(printed)
    return compute


def draw_timelines(plt, timelines, same_scale=True):
    """One row of bars per rank for each (title, Timeline): the events the text timeline
    and the Chrome trace are made of, coloured by kind; `same_scale`: one time axis for all."""
    fig, axes = plt.subplots(len(timelines), 1, figsize=(7, 0.35 * sum(t.num_ranks for _, t in timelines)
                                                          + 0.75 * len(timelines)), squeeze=False)
    for ax, (title, timeline) in zip(axes[:, 0], timelines):
        longest = max(t.makespan for _, t in timelines) if same_scale else timeline.makespan
        chunked = any(e.chunk > 0 for e in timeline.compute)
        for e in timeline.compute:
            start, width = e.start - timeline.t0, e.end - e.start
            ax.barh(e.rank, width, left=start, height=0.8, color=COLOURS[e.kind], ec="white", lw=0.5,
                    alpha=1.0 if e.chunk % 2 == 0 else 0.6)
            label = f"{LETTERS[e.kind]}{e.microbatch}{'abcdefgh'[e.chunk] if chunked else ''}"
            if width > longest / 45:
                ax.text(start + width / 2, e.rank, label, ha="center", va="center", fontsize=6, color="white")
        ax.set_yticks(range(timeline.num_ranks), [f"rank {r}" for r in range(timeline.num_ranks)], fontsize=7)
        ax.set_ylim(timeline.num_ranks - 0.5, -0.5)
        ax.set_xlim(0, longest)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{title}: bubble {timeline.bubble_fraction():.3f}", fontsize=8, loc="left")
    kinds = sorted({e.kind for _, t in timelines for e in t.compute}, key=list(COLOURS).index)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds]
    names = {"forward": "F forward", "backward": "B backward", "backward_input": "B input gradient",
             "backward_weight": "W weight gradient"}
    fig.legend(handles, [names[k] for k in kinds], fontsize=7, ncol=len(kinds), loc="lower center")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def mesh_grid(quick):
    """Chapter 9's 2 x 2 x 2 mesh: rank numbers from parallel.mesh.rank_of, text from Mesh.describe()."""
    dp, tp, pp = 2, 2, 2
    text = run("09_3d/mesh_grid.py", "main", dp, tp, pp, 4, threads=dp * tp * pp)[1]
    return (dp, tp, pp), text


def draw_mesh_grid(plt, shape):
    dp, tp, pp = shape
    fig, axes = plt.subplots(1, pp, figsize=(2.6 * pp, 2.8))
    for stage, ax in enumerate(np.atleast_1d(axes)):
        for d in range(dp):
            ax.add_patch(plt.Rectangle((-0.45, d - 0.4), tp - 0.1, 0.8, color="#c6d4e8"))  # a tp group
            for t in range(tp):
                ax.text(t, d, str(rank_of(d, t, stage, dp, tp)), ha="center", va="center", fontsize=14)
        for t in range(tp):  # a dp group: the same tp column in every dp row
            for d in range(dp - 1):
                ax.plot([t, t], [d + 0.25, d + 0.75], color=COLOURS["backward"], lw=3)
        ax.set_xlim(-0.6, tp - 0.4)
        ax.set_ylim(dp - 0.4, -0.6)
        ax.set_xticks(range(tp), [f"tp{t}" for t in range(tp)])
        ax.set_yticks(range(dp), [f"dp{d}" for d in range(dp)])
        ax.set_title(f"pp stage {stage}", fontsize=9)
    fig.suptitle(f"mesh dp={dp} x tp={tp} x pp={pp}\nblue row: a tp group (adjacent ranks); orange: a dp group;\n"
                 f"a pp group: the same cell in every stage", fontsize=8)
    fig.tight_layout()
    return fig


def loss_parity(quick):
    """Chapter 9: one device and six 8-rank layouts, loss per step (--quick: two layouts, 2 steps)."""
    module = load_script("09_3d/check_layouts.py")
    layouts = module.parse_layouts("2,2,2 1,2,4" if quick else module.LAYOUTS)
    return run("09_3d/check_layouts.py", "main", layouts, 2 if quick else 8, False, False, threads=8)


def draw_loss_parity(plt, curves):
    reference = np.array(curves["one device"])
    steps = np.arange(1, len(reference) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 2.9))
    left.plot(steps, reference, color="black", lw=3, alpha=0.3, label="one device")
    markers = "os^vDx"
    for (name, losses), marker in zip(((n, c) for n, c in curves.items() if n != "one device"), markers):
        left.plot(steps, losses, marker, ms=4, fillstyle="none", label=name)
        relative = np.abs(np.array(losses) - reference) / np.abs(reference)
        right.semilogy(steps, np.maximum(relative, 1e-17), marker, ms=4, fillstyle="none", label=name)
    right.axhline(1e-9, color="red", ls="--", lw=1, label="tolerance 1e-9")
    left.set(xlabel="step", ylabel="loss", title="the loss of every layout on one device's curve")
    right.set(xlabel="step", ylabel="|loss − one device| / loss", title="their differences (0 drawn at 1e-17)")
    for ax in (left, right):
        ax.title.set_fontsize(8)
        ax.set_xticks(steps)
    left.legend(fontsize=6)
    fig.tight_layout()
    return fig


def planner_vs_measured(quick):
    """Chapter 10: the planner's bytes against the real model's, on 2 thread ranks."""
    return run("10_planner/check_memory.py", "main", threads=2)


def draw_planner_vs_measured(plt, predictions):
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    for (label, pairs), marker in zip(predictions.items(), "os^"):
        ax.loglog(pairs[:, 0], pairs[:, 1], marker, ms=7, fillstyle="none", label=label)
    values = np.concatenate([pairs for pairs in predictions.values()]).astype(float)
    line = np.array([values.min() / 2, values.max() * 2])
    ax.loglog(line, line, color="grey", lw=1, ls=":", label="measured = predicted")
    ax.set(xlabel="planner's prediction (bytes)", ylabel="real model (bytes)",
           title="parameters on the line; activations above or below it")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


PICTURES = [
    Picture("train_loss", "02_gpt", train_loss, draw_train_loss),
    Picture("ring_steps", "03_collectives", ring_steps, draw_ring_steps),
    Picture("bandwidth", "03_collectives", bandwidth, draw_bandwidth),
    Picture("bucket_overlap", "04_data_parallel", bucket_overlap, draw_bucket_overlap),
    Picture("zero1_memory", "04_data_parallel", zero1_memory, draw_zero1_memory),
    Picture("gpipe_timeline", "07_pipelines", gpipe_timelines,
            lambda plt, data: draw_timelines(plt, data, same_scale=False)),  # time units vs seconds
    Picture("gpipe_vs_1f1b", "08_1f1b_checkpointing", simulated_timelines("08_1f1b_checkpointing/one_f_one_b.py"),
            draw_timelines),
    Picture("interleaved", "08_1f1b_checkpointing", simulated_timelines("08_1f1b_checkpointing/interleaved.py"),
            draw_timelines),
    Picture("mesh_grid", "09_3d", mesh_grid, draw_mesh_grid),
    Picture("loss_parity", "09_3d", loss_parity, draw_loss_parity),
    Picture("planner_vs_measured", "10_planner", planner_vs_measured, draw_planner_vs_measured),
    Picture("zero_bubble_timelines", "11_zero_bubble", simulated_timelines("11_zero_bubble/three_timelines.py"),
            draw_timelines),
]


def pyplot():
    """matplotlib.pyplot (drawing to files only), or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_small(plt, figure, path):
    """PNG with a palette of at most 64 colours: flat-coloured plots lose nothing and shrink
    several-fold (Pillow comes with matplotlib)."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI)
    plt.close(figure)
    Image.open(buffer).convert("RGB").quantize(64).save(path, optimize=True)


def out_problem(out, pictures):
    """Why `pictures` cannot be written under `out` (one line), or None, their folders made."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file: give a directory (each picture goes to OUT/<chapter>/pictures/<name>.png)"
    try:
        for picture in pictures:
            (out / picture.chapter / "pictures").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"--out {out}: cannot make {error.filename} ({error.strerror}): give a directory you can write"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.pictures", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="pictures to make (default: all; --list names them)")
    parser.add_argument("--out", type=Path, default=TUTORIALS,
                        help="write OUT/<chapter>/pictures/<name>.png (default: the tutorials folder)")
    parser.add_argument("--text", action="store_true", help="print the text form instead of drawing")
    parser.add_argument("--quick", action="store_true", help="short runs (for the tests; not committed)")
    parser.add_argument("--list", action="store_true", help="list the pictures and exit")
    args = parser.parse_args(argv)
    chosen = {p.name: p for p in PICTURES}
    unknown = [n for n in args.names if n not in chosen]
    if unknown:
        parser.error(f"unknown picture(s) {', '.join(unknown)}; choose from {', '.join(chosen)}")
    if args.list:
        for p in PICTURES:
            print(f"{p.name:<22} {p.chapter}/pictures/{p.name}.png")
        return
    plt = None if args.text else pyplot()
    if plt is None and not args.text:
        print("matplotlib is not installed (pip install -e '.[plots]'): printing each picture's text form")
    pictures = [chosen[n] for n in args.names or chosen]
    problem = out_problem(args.out, pictures) if plt else None  # before anything is computed
    if problem:
        parser.error(problem)
    for picture in pictures:
        data, text = picture.compute(args.quick)
        if plt is None:
            print(f"\n=== {picture.chapter}: {picture.name}\n{text.rstrip()}")
            continue
        path = args.out / picture.chapter / "pictures" / f"{picture.name}.png"
        save_small(plt, picture.draw(plt, data), path)
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
