"""Chapter 10, 'At scale': the planner's GPU-cluster model against Megatron-LM's Table 1, and the held-out
checks: Table 5 of Korthikanti et al. 2022, then the 2021 paper's Table 2 and the orderings of its sweeps.

    python tutorials/10_planner/at_scale.py            # the tables (python -m parallel.plan --validate-published)
    python tutorials/10_planner/at_scale.py --picture  # also redraw pictures/at_scale.png
"""
import sys
from pathlib import Path

from parallel.plan.cluster import model_flops
from parallel.plan.profiles import load_profile
from parallel.plan.published import DEVICE, GOAL_ERROR, TABLE_1, row_config, validate_published, validate_table_5

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


def render(results, path=PICTURE):
    """Predicted against published TFLOP/s per GPU, one point per row of each table, the ±15% band shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = {"Narayanan et al. 2021, Table 1 (full recomputation)":
              [(f"{row[0]:g}B", r["published"], r["predicted"]) for row, r in zip(TABLE_1, results)]}
    for mode, points in table_5_points().items():
        series[f"Korthikanti et al. 2022, Table 5 ({mode}; held out)"] = points
    fig, ax = plt.subplots(figsize=(6, 5.5))
    line = [110, 260]
    ax.plot(line, line, color="black", lw=1, label="predicted = published")
    ax.fill_between(line, [x * (1 - GOAL_ERROR) for x in line], [x * (1 + GOAL_ERROR) for x in line],
                    color="tab:green", alpha=0.15, label=f"±{GOAL_ERROR:.0%}")
    for (name, points), color, marker in zip(series.items(), ("tab:blue", "tab:orange", "tab:purple"), "o^s"):
        ax.scatter([x for _, x, _ in points], [y for _, _, y in points], color=color, marker=marker, zorder=3,
                   label=name)
        for i, (label, x, y) in enumerate(points):  # neighbours' labels on opposite sides
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, -3) if i % 2 else (-5, 3),
                        ha="left" if i % 2 else "right", fontsize=7, color=color)
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
