"""Chapter 23's pictures, from its scripts' own functions: an outlier tensor quantized per
tensor and per tile; the accumulator model's error against K; the loss curves of bf16 and
the two FP8 recipes on one seed; AdamW's moments in float32 and bfloat16: bytes and loss."""
from argparse import Namespace

import numpy as np

from .draw import COLOURS, Picture, load_script, printed


def outliers(quick):
    """outliers.py's tensor: |x| of its non-zero values and what each scaling flushes to zero."""
    script = load_script("23_fp8/outliers.py")
    x = script.outlier_tensor()
    report = script.quantization_report(x)
    text = "\n".join(f"e4m3 {name}: flushed to zero {f:.1%}, median relative error {e:.2e}"
                     for name, (f, e) in report.items())
    return (np.abs(x[x != 0]), float(np.abs(x).max()), report), text


def draw_outliers(plt, data):
    magnitudes, amax, report = data
    fig, (left, right) = plt.subplots(1, 2, figsize=(7, 3.1), gridspec_kw={"width_ratios": [3, 2]})
    bins = np.logspace(-6, np.log10(amax) + 0.5, 60)
    left.hist(magnitudes, bins=bins, color=COLOURS["forward"])
    left.set_xscale("log")
    left.set_yscale("log")
    # per tensor: x·s < half e4m3's smallest subnormal (2^-10) rounds to 0, with s = 448 / amax
    line = 2.0**-10 * amax / 448
    left.axvline(line, color=COLOURS["backward_input"], lw=1.5)
    left.text(line, left.get_ylim()[1] * 0.3, "per tensor:\nflushed to\nthe left ", fontsize=7, ha="right",
              color=COLOURS["backward_input"])
    left.set_xlabel("|x| (256 x 512 activation, one outlier)", fontsize=8)
    left.set_ylabel("values", fontsize=8)
    names = list(report)
    right.bar(range(len(names)), [100 * report[n][0] for n in names],
              color=[COLOURS["backward_input"], COLOURS["backward_weight"]], width=0.6)
    for k, name in enumerate(names):
        right.text(k, 100 * report[name][0], f"{report[name][0]:.1%}\nmedian error\n{report[name][1]:.1e}",
                   ha="center", va="bottom", fontsize=7)
    right.set_xticks(range(len(names)), names, fontsize=8)
    right.set_ylabel("% of values flushed to zero (e4m3)", fontsize=8)
    right.set_ylim(0, 100 * max(r[0] for r in report.values()) * 1.6 + 1)
    for ax in (left, right):
        ax.tick_params(labelsize=7)
    fig.suptitle("one outlier sets the per-tensor scale; a 1x128 tile's scale is its own", fontsize=9)
    fig.tight_layout()
    return fig


def accumulation(quick):
    script = load_script("23_fp8/accumulation.py")
    rows, text = printed(lambda: script.errors(script.KS[:3] if quick else script.KS))
    return rows, "\n".join(f"K = {k}: without promotion {a:.2e}, promoted every 128 {b:.2e}" for k, a, b in rows)


def draw_accumulation(plt, rows):
    ks, plain, promoted = (np.array([r[i] for r in rows]) for i in range(3))
    fig, ax = plt.subplots(figsize=(5.5, 3.3))
    ax.loglog(ks, plain, "o-", color=COLOURS["backward_input"], label="14-bit accumulator over all of K")
    ax.loglog(ks, promoted, "s-", color=COLOURS["backward_weight"], label="promoted to float32 every 128")
    ax.set_xticks(ks, [str(k) for k in ks], fontsize=7)
    ax.set_xlabel("K (length of the dot product)", fontsize=8)
    ax.set_ylabel("relative error of the product", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    ax.set_title("a MODEL of the tensor core's accumulator (not the hardware)", fontsize=8)
    fig.tight_layout()
    return fig


def loss_curves(quick):
    script = load_script("23_fp8/loss_curves.py")
    losses, text = printed(script.main, Namespace(steps=20 if quick else 100))
    return losses, text


def draw_loss_curves(plt, losses):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 4.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    styles = {"bf16": ("-", COLOURS["forward"]), "fp8-delayed": ("--", COLOURS["backward"]),
              "fp8-blockwise": (":", COLOURS["backward_weight"])}
    steps = np.arange(1, len(losses["bf16"]) + 1)
    for name, curve in losses.items():
        style, colour = styles[name]
        top.plot(steps, curve, style, color=colour, lw=1.3, label=name)
        if name != "bf16":
            bottom.plot(steps, np.array(curve) - np.array(losses["bf16"]), style, color=colour, lw=1.3, label=name)
    bottom.axhline(0, color="grey", lw=0.6)
    top.set_ylabel("training loss", fontsize=8)
    bottom.set_ylabel("loss − bf16's", fontsize=8)
    bottom.set_xlabel("step", fontsize=8)
    for ax in (top, bottom):
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    top.set_title("the addition GPT, one seed: bf16 vs the two FP8 recipes", fontsize=8)
    fig.tight_layout()
    return fig


def moments(quick):
    """bf16_moments.py: bytes of optimizer state per parameter, and the loss of every step, by moment dtype."""
    script = load_script("23_fp8/bf16_moments.py")
    curves, text = printed(script.main, Namespace(steps=20 if quick else 100))
    return (script.bytes_per_parameter(), curves), text


def draw_moments(plt, data):
    state, curves = data
    fig = plt.figure(figsize=(8, 4.2))
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 3], height_ratios=[3, 2])
    bytes_ax = fig.add_subplot(grid[:, 0])
    names = list(state)
    for k, name in enumerate(names):
        planned, held = state[name]
        bottom = 0
        for part, size, colour in (("master", planned - held, "#bbbbbb"), ("m", held / 2, COLOURS["forward"]),
                                   ("v", held / 2, COLOURS["backward"])):
            bytes_ax.bar(k, size, bottom=bottom, color=colour, ec="white", width=0.6)
            bytes_ax.text(k, bottom + size / 2, f"{part}\n{size:g}", ha="center", va="center", fontsize=7)
            bottom += size
        bytes_ax.text(k, bottom, f"{planned:g}", ha="center", va="bottom", fontsize=8, fontweight="bold")
    bytes_ax.set_xticks(range(len(names)), [f"{n}\nmoments" for n in names], fontsize=7)
    bytes_ax.set_ylabel("optimizer bytes per parameter", fontsize=8)
    bytes_ax.set_ylim(0, 1.12 * max(planned for planned, _ in state.values()))
    bytes_ax.set_title("float32 master + moments m, v", fontsize=8)
    loss_ax = fig.add_subplot(grid[0, 1])
    gap_ax = fig.add_subplot(grid[1, 1], sharex=loss_ax)
    steps = np.arange(len(curves["float32"]))  # the loss of step s: after s optimizer steps
    styles = {"float32": ("-", COLOURS["forward"], 2.5), "bfloat16": ("--", COLOURS["backward"], 1.3)}
    for name, curve in curves.items():
        style, colour, width = styles[name]
        loss_ax.plot(steps, curve, style, color=colour, lw=width, label=f"{name} moments")
    gap = np.array(curves["bfloat16"]) - np.array(curves["float32"])
    gap_ax.plot(steps, gap, color=COLOURS["backward_input"], lw=1.2)
    gap_ax.axhline(0, color="grey", lw=0.6)
    gap_ax.annotate("after step 1: the same to every digit", (1, gap[1]), (0.12, 0.8), textcoords="axes fraction",
                    fontsize=7, arrowprops=dict(arrowstyle="-|>", color="#777777", lw=0.6))
    loss_ax.set_ylabel("training loss", fontsize=8)
    loss_ax.legend(fontsize=7)
    loss_ax.set_title("the addition GPT under --precision bf16, one seed: the curves lie on each other", fontsize=8)
    loss_ax.tick_params(labelbottom=False)
    gap_ax.set_ylabel("loss: bfloat16's\n− float32's", fontsize=8)
    gap_ax.set_xlabel("optimizer steps taken", fontsize=8)
    for ax in (bytes_ax, loss_ax, gap_ax):
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


PICTURES = [Picture("fp8_outliers", "23_fp8", outliers, draw_outliers),
            Picture("fp8_accumulation", "23_fp8", accumulation, draw_accumulation),
            Picture("fp8_loss_curves", "23_fp8", loss_curves, draw_loss_curves),
            Picture("bf16_moments", "23_fp8", moments, draw_moments)]
