"""Chapter 19's pictures from routing.py's numbers: tokens per expert as a histogram (with and
without the balancing loss) and the dispatch all-to-all as a grid. Needs matplotlib.

    python tutorials/19_mixture_of_experts/draw.py
"""
from pathlib import Path

import numpy as np
import routing

from minitensor.data import AdditionTask

HERE = Path(__file__).parent / "pictures"


def main():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    task = AdditionTask(digits=2, seed=0)
    HERE.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3))
    for shift, aux in ((-0.2, 0.0), (0.2, 0.01)):
        ax.bar(np.arange(routing.EXPERTS) + shift, routing.loads(aux, 60, task), width=0.4, label=f"α = {aux}")
    ax.set(xlabel="expert", ylabel="tokens (last 10 steps)", title="tokens per expert")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "tokens_per_expert.png", dpi=100)
    grid = routing.dispatch_grid(task)
    fig, ax = plt.subplots(figsize=(4, 3.5))
    ax.imshow(grid, cmap="Blues")
    for (r, s), n in np.ndenumerate(grid):
        ax.text(s, r, str(n), ha="center", va="center")
    ax.set(xlabel="to rank", ylabel="from rank", title="dispatch all-to-all: rows sent")
    fig.tight_layout()
    fig.savefig(HERE / "all_to_all_grid.png", dpi=100)
    print(f"wrote {HERE / 'tokens_per_expert.png'} and {HERE / 'all_to_all_grid.png'}")


if __name__ == "__main__":
    main()
