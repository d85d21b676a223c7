"""Chapter 10, 'At scale': the planner's GPU-cluster model against Megatron-LM's Table 1, the held-out
Table 5 of Korthikanti et al. 2022, the 2021 paper's Table 2 (the one calibration) and the orderings of
its sweeps (held out).

    python tutorials/10_planner/at_scale.py            # the tables (python -m parallel.plan --validate-published)
    python tutorials/10_planner/at_scale.py --picture  # also redraw pictures/at_scale.png
"""
import sys
from pathlib import Path

from parallel.plan.cluster import model_flops
from parallel.plan.profiles import load_profile
from parallel.plan.published import DEVICE, GOAL_ERROR, TABLE_1, row_config, validate_published, validate_table_5
from parallel.plan.published_sweeps import validate_table_2

PICTURE = Path(__file__).with_name("pictures") / "at_scale.png"


def table_5_points():
    """(label, published, predicted) TFLOP/s per GPU of Table 5's rows, both by the 2021 paper's eq. 3 (the
    flops it counts, recomputation included, over each run's seconds): the same unit as Table 1."""
    points = {}
    for r in validate_table_5(load_profile(DEVICE), out=lambda line: None):
        row = r["row"]
        flops_per_gpu = model_flops(row_config(row), row[7]) / (row[6] * 1e12)
        points.setdefault(r["mode"], []).append((f"{row[0]:g}B", flops_per_gpu / r["published"], r["step"].tflops))
    return points


def spread_labels(ax, points, color, shift, gap=4.0):
    """Label each (label, x, y) point `shift` TFLOP/s to its side, the labels moved apart to at least `gap`
    in y (bottom up), each joined to its point by a thin line when it had to move."""
    placed = -1e9
    for label, x, y in sorted(points, key=lambda point: point[2]):
        placed = max(y, placed + gap)
        ax.annotate(label, (x, y), xytext=(x + shift, placed), textcoords="data",
                    ha="right" if shift < 0 else "left", va="center",
                    fontsize=7, color=color,
                    arrowprops=dict(arrowstyle="-", lw=0.4, color=color) if placed != y else None)


def render(results, path=PICTURE):
    """Predicted against published TFLOP/s per GPU, one point per row of each table, the ±15% band shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = {"Narayanan et al. 2021, Table 1 (full recomputation)":
              [(f"{row[0]:g}B", r["published"], r["predicted"]) for row, r in zip(TABLE_1, results)]}
    for mode, points in table_5_points().items():
        series[f"Korthikanti et al. 2022, Table 5 ({mode}; held out)"] = points
    series["Narayanan et al. 2021, Table 2 (the calibration)"] = [
        (f"{r['row'][0]:g}B/{r['row'][6]}", r["published"], r["predicted"])
        for r in validate_table_2(load_profile(DEVICE), out=lambda line: None)]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    line = [110, 260]
    ax.plot(line, line, color="black", lw=1, label="predicted = published")
    ax.fill_between(line, [x * (1 - GOAL_ERROR) for x in line], [x * (1 + GOAL_ERROR) for x in line],
                    color="tab:green", alpha=0.15, label=f"±{GOAL_ERROR:.0%}")
    colors = ("tab:blue", "tab:orange", "tab:purple", "tab:gray")
    for (name, points), color, marker, shift in zip(series.items(), colors, "o^sD", (-14, 8, -8, 0)):
        ax.scatter([x for _, x, _ in points], [y for _, _, y in points], color=color, marker=marker, zorder=3,
                   label=name, s=18 if marker == "D" else 30)
        if marker != "D":  # Table 2's points sit among Table 1's: the legend names them, labels would crowd
            spread_labels(ax, points, color, shift)
    ax.set_xlim(*line)
    ax.set_ylim(*line)
    ax.set_xlabel("published TFLOP/s per GPU (the 2021 paper's eq. 3 over the published time)")
    ax.set_ylabel("predicted TFLOP/s per GPU (parallel.plan.cluster)")
    ax.set_title("Megatron-LM on up to 3072 A100s: the planner vs two papers", fontsize=10)
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    results = validate_published()
    if "--picture" in argv:
        print(f"wrote {render(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
