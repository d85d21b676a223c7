"""What every picture shares: running a chapter script's function, the Picture record, the
colours, and the two drawings several chapters use (timelines of events; a traced graph)."""
import contextlib
import importlib.util
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parallel.comm import run_on_ranks
from parallel.pipeline.timeline import LETTERS

TUTORIALS = Path(__file__).resolve().parent.parent
DPI = 80  # small files: a few tens of KB each
COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "backward_input": "#c44e52", "backward_weight": "#55a868"}
RANKS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]  # rank r's colour


@dataclass
class Picture:
    name: str       # the file name (without .png) and the command-line name
    chapter: str    # its folder under tutorials/
    compute: object  # quick -> (data, the chapter's text for it)
    draw: object     # (plt, data) -> Figure


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


def printed(fn, *args, threads=None):
    """(what `fn(*args)` returned, what it printed), on `threads` thread ranks if given (rank 0's value)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = run_on_ranks(threads, fn, *args)[0] if threads else fn(*args)
    return result, out.getvalue()


def run(path, function, *args, threads=None):
    """(what it returned, what it printed) of the script's `function(*args)`."""
    return printed(getattr(load_script(path), function), *args, threads=threads)


def draw_timelines(plt, timelines, same_scale=True, extra_rows=0):
    """One row of bars per rank for each (title, Timeline): the events the text timeline
    and the Chrome trace are made of, coloured by kind; `same_scale`: one time axis for all.
    `extra_rows` empty axes below them (returned too) for what a caller adds."""
    heights = [t.num_ranks * 0.35 + 0.5 for _, t in timelines] + [1.6] * extra_rows
    fig, axes = plt.subplots(len(heights), 1, figsize=(7, sum(heights) + 0.4), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    longest = max(t.makespan for _, t in timelines)
    chunked = any(e.chunk > 0 for _, t in timelines for e in t.compute)
    for ax, (title, timeline) in zip(axes[:, 0], timelines):
        scale = longest if same_scale else timeline.makespan
        for e in timeline.compute:
            start, width = e.start - timeline.t0, e.end - e.start
            ax.barh(e.rank, width, left=start, height=0.8, color=COLOURS[e.kind], ec="white", lw=0.5,
                    alpha=1.0 if e.chunk % 2 == 0 else 0.55)
            label = f"{LETTERS[e.kind]}{e.microbatch}{'abcdefgh'[e.chunk] if chunked else ''}"
            if width > scale / 45:
                ax.text(start + width / 2, e.rank, label, ha="center", va="center", fontsize=6, color="white")
        ax.set_yticks(range(timeline.num_ranks), [f"rank {r}" for r in range(timeline.num_ranks)], fontsize=7)
        ax.set_ylim(timeline.num_ranks - 0.5, -0.5)
        ax.set_xlim(0, scale)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{title}: bubble {timeline.bubble_fraction():.3f}", fontsize=8, loc="left")
    kinds = sorted({e.kind for _, t in timelines for e in t.compute}, key=list(COLOURS).index)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds]
    names = {"forward": "F forward", "backward": "B backward (input + weight gradients)",
             "backward_input": "B input gradient only", "backward_weight": "W weight gradient"}
    labels = [names[k] for k in kinds]
    if chunked:
        handles += [plt.Rectangle((0, 0), 1, 1, color="grey"), plt.Rectangle((0, 0), 1, 1, color="grey", alpha=0.55)]
        labels += ["full colour: model chunk a", "lighter: model chunk b"]
    fig.legend(handles, labels, fontsize=7, ncol=min(len(labels), 4), loc="lower center")
    fig.tight_layout(rect=(0, 0.3 / (sum(heights) + 0.4), 1, 1))
    return fig, axes[len(timelines):, 0]


def draw_graph(ax, graph, colour=None, label=None, params=None, spacing=2.8, fontsize=6):
    """A traced graph, top to bottom: an op is a box one row below the deepest value it reads,
    side by side within a row; each op's parameters one ellipse to its right; inputs on row 0.
    `colour(node)`, `label(node)` choose an op's fill and text, `params(node, names)` -> (text,
    fill) its parameters'; `fontsize` the ops' text (parameters: half a point less).
    Returns {name: (x, y)} of the ops and inputs."""
    by_name = {n.name: n for n in graph.nodes}
    depth, rows, where = {}, {}, {}
    for n in graph.nodes:
        if n.op != "param":
            depth[n.name] = 0 if n.op in ("input", "constant") else \
                1 + max((depth[i] for i in n.inputs if i in depth), default=0)
            rows.setdefault(depth[n.name], []).append(n.name)
    for d, names in rows.items():
        for k, name in enumerate(names):
            where[name] = ((k - (len(names) - 1) / 2) * spacing, d)
    for n in graph.nodes:
        if n.op == "param":
            continue
        x, y = where[n.name]
        for i in n.inputs:
            if i in where:
                (x0, y0), long = where[i], depth[n.name] - depth[i] > 1
                ax.annotate("", (x, y - 0.25), (x0, y0 + 0.25), arrowprops=dict(
                    arrowstyle="-|>", color="#777777", lw=0.6, shrinkA=0, shrinkB=0,
                    connectionstyle="arc3,rad=0.25" if long else "arc3"))
        leaf = n.op in ("input", "constant")
        ax.text(x, y, label(n) if label else (n.name if leaf else n.op), ha="center", va="center", fontsize=fontsize,
                bbox=dict(boxstyle="round,pad=0.3" if leaf else "square,pad=0.3",
                          fc=colour(n) if colour else ("#eeeeee" if leaf else "#c6d4e8"), ec="#333333", lw=0.6))
        mine = [i for i in n.inputs if by_name[i].op == "param"]
        if mine:
            text, fill = params(n, mine) if params else (mine[0].rsplit(".", 1)[0] + " (W, b)", "#f3d9c4")
            ax.annotate(text, (x + 0.35 * spacing, y), (x + 0.52 * spacing, y - 0.45), fontsize=fontsize - 0.5,
                        ha="center",
                        va="center", bbox=dict(boxstyle="round,pad=0.25", fc=fill, ec="#999999", lw=0.5),
                        arrowprops=dict(arrowstyle="-|>", color="#999999", lw=0.5))
    xs, ys = zip(*where.values())
    ax.set_xlim(min(xs) - 0.5 * spacing, max(xs) + 0.8 * spacing)
    ax.set_ylim(max(ys) + 0.6, min(ys) - 0.8)
    ax.axis("off")
    return where


def stored_microbatches(timeline, rank):
    """(times, count) of the micro-batches `rank` holds activations for: +1 when a forward ends,
    −1 when its backward ends (the input-gradient half, where backward is split)."""
    changes = sorted([(e.end - timeline.t0, +1) for e in timeline.compute if e.rank == rank and e.kind == "forward"]
                     + [(e.end - timeline.t0, -1) for e in timeline.compute
                        if e.rank == rank and e.kind in ("backward", "backward_input")])
    times, counts = [0.0], [0]
    for t, step in changes:
        times.append(t)
        counts.append(counts[-1] + step)
    return np.array(times), np.array(counts)
