"""Chapters 12, 14, 15: seconds to target per method and link, error feedback, ZeRO's bytes and prefetch,
the loss scale, the flush to zero."""
import re

import numpy as np

import parallel
from parallel.bench import compress as bench
from parallel.data_parallel.comm_hooks import TopK

from .draw import COLOURS, RANKS, Picture, load_script, printed

MEASURED = "12_communication/measured/compress_runs.jsonl"
METHOD_NAMES = {"none": "plain DP", "powersgd:4": "PowerSGD r4", "topk:0.01": "top-k 1%", "sign": "sign",
                "local:4": "DiLoCo H4", "localsgd:4": "local SGD H4"}


def seconds_to_target(quick):
    """Chapter 12: `python -m parallel.bench compress`'s rows, from the committed runs (no training):
    seconds = median steps to 95% × median step time, per dp, link and method."""
    from .draw import TUTORIALS

    path = str(TUTORIALS / MEASURED)
    runs, rows = bench.Runs(path), []
    for dp in (2, 4):
        for method in bench.METHODS:
            steps = [runs.done[("steps", dp, "loopback", method, seed)] for seed in (0, 1, 2)]
            for link in ("100mbe", "1gbe", "loopback"):
                rows.append(bench.summarise(dp, link, method, steps,
                                            [runs.done[("timing", dp, link, method, seed)] for seed in (0, 1, 2)]))
    return rows, printed(bench.main, ["--dp", "2", "4", "--results", path])[1]


def draw_seconds_to_target(plt, rows):
    links, methods = ["100mbe", "1gbe", "loopback"], bench.METHODS
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0), sharey=True)
    for ax, dp in zip(axes, (2, 4)):
        width = 0.8 / len(methods)
        top = max(r["seconds_to_target"] for r in rows if np.isfinite(r["seconds_to_target"]))
        for m, method in enumerate(methods):
            for k, link in enumerate(links):
                row = next(r for r in rows if (r["dp"], r["link"], r["method"]) == (dp, link, method))
                x, seconds = k - 0.4 + (m + 0.5) * width, row["seconds_to_target"]
                if np.isfinite(seconds):
                    ax.bar(x, seconds, width, color=RANKS[m])
                else:
                    ax.text(x, 2, "never", rotation=90, fontsize=6, ha="center", va="bottom")
        ax.set_xticks(range(len(links)), links, fontsize=8)
        ax.set_title(f"dp {dp}", fontsize=8)
        ax.set_ylim(0, top * 1.1)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("seconds to 95% exact match", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=RANKS[m]) for m in range(len(methods))]
    axes[1].legend(handles, [METHOD_NAMES[m] for m in methods], fontsize=6, ncol=2, loc="upper right")
    fig.suptitle("time to a trained model = steps × step time (medians of 3 seeds, measured/compress_runs.jsonl):\n"
                 "on a slow link compression wins; on loopback plain DP does", fontsize=8)
    fig.tight_layout()
    return fig


def error_feedback(quick):
    """Chapter 12: error_feedback.py's three runs (2 thread ranks, 100 steps; --quick: 12), through the
    script's own `train`, with each step's loss recorded as the run goes."""
    script = load_script("12_communication/addition_run.py")
    losses = {}

    class Recording(script.DataParallel):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            losses.setdefault((id(self.module), self.group.rank), []).append(output[1].item())
            return output
        __call__ = forward
    script.DataParallel = Recording
    steps = 12 if quick else 100
    runs = [("all-reduce", None), ("top-k 1% with error feedback", lambda: TopK(0.01)),
            ("top-k 1% without error feedback", lambda: TopK(0.01, error_feedback=False))]

    def all_runs():
        group = parallel.world()
        results = {}
        for name, hook in runs:
            loss, nbytes, model = script.train(group, steps, hook and hook())
            mine = losses[(id(model), group.rank)]
            results[name] = (loss, nbytes, np.mean(group.all_gather(np.array([mine])), axis=0))
        return results
    results = printed(all_runs, threads=2)[0]
    text = "\n".join(f"  {name:<32} loss {loss:.4f}   bytes per step per rank {nbytes:>9,.0f}"
                     for name, (loss, nbytes, _) in results.items())
    return results, f"{steps} AdamW steps on 2 ranks; loss = mean of the last 10 steps\n{text}"


def draw_error_feedback(plt, results):
    fig, ax = plt.subplots(figsize=(6, 3.0))
    colours = [COLOURS["forward"], COLOURS["backward_weight"], COLOURS["backward_input"]]
    for (name, (loss, nbytes, curve)), colour in zip(results.items(), colours):
        smooth = np.convolve(curve, np.ones(5) / 5, mode="valid") if len(curve) > 10 else curve
        ax.plot(np.arange(len(smooth)) + (len(curve) - len(smooth)), smooth, color=colour, lw=1.2,
                label=f"{name}: last 10 {loss:.3f}, {nbytes / 1e3:,.0f} kB/step")
    ax.set(xlabel="step", ylabel="loss (mean of ranks, 5 steps)")
    ax.set_title("top-k sends 1% of each gradient; error feedback sends the other 99% later, instead of never",
                 fontsize=7)
    ax.legend(fontsize=7)
    ax.xaxis.label.set_fontsize(8)
    ax.yaxis.label.set_fontsize(8)
    fig.tight_layout()
    return fig


def zero_bytes(quick):
    """Chapter 14: who_holds_what.py's bytes held per rank by kind for stages 0–3 (its `train`, 4 thread
    ranks, 3 steps; --quick: 1), with the formula of parallel.plan beside."""
    script = load_script("14_zero_sharding/who_holds_what.py")
    steps = 1 if quick else 3

    def every_stage():
        group = parallel.world()
        data = script.batches(steps, 2 * group.size)
        return {stage: group.all_gather(np.array([[script.train(group, stage, data)[0][k] for k in script.KINDS]]))
                for stage in range(4)}
    held = printed(every_stage, threads=4)[0]
    formula = {s: script.param_bytes_per_rank(script.CONFIG, 4, 1, 1, (0, 0, 0), "float64", s) for s in range(4)}
    text = "\n".join(f"stage {s}: " + "; ".join(f"{k} rank 0..3 {list(map(int, held[s][:, c]))} B (formula "
                                                 f"{formula[s][k]:,})" for c, k in enumerate(script.KINDS))
                     for s in range(4))
    return (held, formula, script.KINDS), text


def draw_zero_bytes(plt, data):
    held, formula, kinds = data
    fig, ax = plt.subplots(figsize=(6, 3.0))
    colours = {"params": COLOURS["forward"], "grads": COLOURS["backward"], "optim": COLOURS["backward_weight"]}
    ranks = held[0].shape[0]
    for stage in range(4):
        for r in range(ranks):
            x, bottom = stage * (ranks + 1) + r, 0
            for c, kind in enumerate(kinds):
                ax.bar(x, held[stage][r, c] / 1e3, 0.85, bottom=bottom, color=colours[kind],
                       label=kind if (stage, r) == (0, 0) else None)
                bottom += held[stage][r, c] / 1e3
        total = sum(formula[stage][k] for k in kinds) / 1e3
        ax.plot([stage * (ranks + 1) - 0.45, stage * (ranks + 1) + ranks - 0.55], [total] * 2, color="black",
                ls="--", lw=1, label="formula (Rajbhandari et al.)" if stage == 0 else None)
    ax.set_xticks([s * (ranks + 1) + (ranks - 1) / 2 for s in range(4)],
                  ["stage 0\nplain DP", "stage 1\n+ states", "stage 2\n+ gradients", "stage 3\n+ parameters"],
                  fontsize=7)
    ax.set_ylabel("bytes held per rank (kB)", fontsize=8)
    ax.set_title(f"ZeRO on {ranks} ranks: each bar a rank, stacked by kind; each stage shards one more kind",
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def prefetch(quick):
    """Chapter 14: prefetch_timeline.py's events of rank 0 (its `one_step`, 2 thread ranks), prefetch 0 and 1."""
    script = load_script("14_zero_sharding/prefetch_timeline.py")

    def both():
        return {p: script.one_step(parallel.world(), p) for p in (0, 1)}
    runs = printed(both, threads=2)[0]
    text = "\n".join(f"prefetch {p}: forward gathers issued before the previous unit computed: "
                     "{} of {}".format(*script.issued_ahead(events)) + f"; peak gathered bytes {peak:,}"
                     for p, (_, events, peak, _) in runs.items())
    return runs, text


def draw_prefetch(plt, runs):
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0), sharey=True)
    for ax, (p, (schedule, events, peak, largest)) in zip(axes, runs.items()):
        forward = [e for e in events if e[0] == "F" or "forward" in e[0]]  # rank 0's forward, in order
        units = [unit for kind, unit in schedule if kind == "forward"]
        issued = {}
        for k, (kind, unit, _, _) in enumerate(forward):
            y = units.index(unit)
            if kind.endswith("issue"):
                issued[unit] = k
            elif kind.endswith("wait"):
                ax.plot([issued[unit], k + 0.4], [y, y], color=COLOURS["backward"], lw=3, solid_capstyle="butt",
                        label="all-gather issued … waited for" if y == 0 else None)
            else:
                ax.barh(y, 0.9, left=k - 0.45, color=COLOURS["forward"], label="unit's forward" if y == 0 else None)
        ax.set_yticks(range(len(units)), units, fontsize=7)
        ax.set_ylim(len(units) - 0.5, -0.5)
        ax.set_xlabel("rank 0's events, in the order they happened", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
        ax.set_title(f"prefetch {p}: peak gathered {peak / 1e3:,.0f} kB\n(= {1 + p} × the largest unit)",
                     fontsize=8)
    axes[1].legend(fontsize=6, loc="lower left")
    fig.suptitle("ZeRO-3's forward: with prefetch 1 the next unit's all-gather is in flight while this one computes",
                 fontsize=8)
    fig.tight_layout()
    return fig


def loss_scale(quick):
    """Chapter 15: scaler_trajectory.py on 4 thread ranks (dp 2 x tp 2), the steps as it prints them."""
    text = printed(load_script("15_mixed_precision/scaler_trajectory.py").main, threads=4)[1]
    steps = [(int(s), float(e), what.startswith("skipped"), float(loss)) for s, e, what, loss in
             re.findall(r"step\s+(\d+): loss scale 2\^(\S+)\s+(skipped|stepped).*?loss ([\d.naninf]+)", text)]
    return steps, text


def draw_loss_scale(plt, steps):
    fig, ax = plt.subplots(figsize=(6, 2.8))
    step, exponent, skipped = (np.array([s[i] for s in steps]) for i in range(3))
    ax.step(step, exponent, where="mid", color=COLOURS["forward"], lw=1.5)
    ax.plot(step[~skipped], exponent[~skipped], "o", color=COLOURS["forward"], ms=4, label="stepped")
    ax.plot(step[skipped], exponent[skipped], "X", color="red", ms=8, label="skipped: an inf/nan gradient")
    ax.set(xlabel="step", ylabel="loss scale (log2)")
    ax.set_xticks(step)
    ax.tick_params(labelsize=7)
    ax.set_title("the dynamic loss scale: halves and skips on an overflow, doubles after 4 clean steps;\n"
                 "at step 14 only one of 4 ranks sees the inf, and all of them skip", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def flush_to_zero(quick):
    """Chapter 15: the GPT gradients of underflow.py (its `gradients`, its data), their float64 magnitudes,
    and how many float16 flushes to zero at each loss scale; the text is the script's `underflow()`."""
    script = load_script("15_mixed_precision/underflow.py")
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 11, (8, 8)), rng.integers(0, 11, (8, 8))
    exact = script.gradients(np.float64, 1.0, idx, targets)
    flushed = {}
    for scale in (1.0, 2.0**8, 2.0**16):
        grads = script.gradients(np.float16, scale, idx, targets)
        flushed[scale] = sum(int(((g == 0) & (e != 0)).sum()) for g, e in zip(grads, exact))
    values = np.abs(np.concatenate([e.ravel() for e in exact]))
    return (values[values > 0], flushed), printed(script.underflow)[1]


def draw_flush_to_zero(plt, data):
    values, flushed = data
    fig, ax = plt.subplots(figsize=(6.5, 3.0))
    exponents = np.log2(values)
    ax.hist(exponents, bins=np.arange(np.floor(exponents.min()), np.ceil(exponents.max()) + 1), color="#c6d4e8",
            ec="white", log=True, label=f"float64 gradients ({len(values):,} non-zero)")
    for (scale, zeros), colour in zip(flushed.items(), (COLOURS["backward_input"], COLOURS["backward"],
                                                        COLOURS["backward_weight"])):
        edge = -24 - np.log2(scale)  # scaled by s, a gradient g is stored as g·s: it flushes below 2^-24 / s
        ax.axvline(edge, color=colour, lw=2, label=f"scale 2^{np.log2(scale):.0f}: below 2^{edge:.0f} flushes "
                                                   f"to 0 in float16 ({zeros:,} did)")
    ax.set(xlabel="log2 |gradient| (float64)", ylabel="gradients (log scale)")
    ax.xaxis.label.set_fontsize(8)
    ax.yaxis.label.set_fontsize(8)
    ax.tick_params(labelsize=7)
    ax.set_title("float16's smallest subnormal is 2^-24: scaling the loss by 2^s moves the flush line s to the left",
                 fontsize=8)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    return fig


PICTURES = [
    Picture("seconds_to_target", "12_communication", seconds_to_target, draw_seconds_to_target),
    Picture("error_feedback", "12_communication", error_feedback, draw_error_feedback),
    Picture("zero_bytes", "14_zero_sharding", zero_bytes, draw_zero_bytes),
    Picture("prefetch", "14_zero_sharding", prefetch, draw_prefetch),
    Picture("loss_scale", "15_mixed_precision", loss_scale, draw_loss_scale),
    Picture("flush_to_zero", "15_mixed_precision", flush_to_zero, draw_flush_to_zero),
]
