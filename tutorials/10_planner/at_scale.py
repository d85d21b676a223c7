"""Chapter 10, 'At scale': the planner's GPU-cluster model against Megatron-LM's Table 1.

    python tutorials/10_planner/at_scale.py            # the table (python -m parallel.plan --validate-published)
    python tutorials/10_planner/at_scale.py --picture  # also redraw pictures/at_scale.png
"""
import sys
from pathlib import Path

from parallel.plan.published import GOAL_ERROR, TABLE_1, validate_published

PICTURE = Path(__file__).with_name("pictures") / "at_scale.png"


def render(results, path=PICTURE):
    """Predicted against published TFLOP/s per GPU, one point per row, the ±15% band shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    published = [r["published"] for r in results]
    predicted = [r["predicted"] for r in results]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    line = [120, 200]
    ax.plot(line, line, color="black", lw=1, label="predicted = published")
    ax.fill_between(line, [x * (1 - GOAL_ERROR) for x in line], [x * (1 + GOAL_ERROR) for x in line],
                    color="tab:green", alpha=0.15, label=f"±{GOAL_ERROR:.0%}")
    ax.scatter(published, predicted, color="tab:blue", zorder=3)
    for row, x, y in zip(TABLE_1, published, predicted):
        ax.annotate(f"{row[0]:g}B", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=8)
    ax.set_xlim(*line)
    ax.set_ylim(*line)
    ax.set_xlabel("published TFLOP/s per GPU (Narayanan et al. 2021, Table 1)")
    ax.set_ylabel("predicted TFLOP/s per GPU (parallel.plan.cluster)")
    ax.set_title("Megatron-LM on up to 3072 A100s: the planner vs the paper", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
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
