"""Chapter 13's picture, from staleness.py's own `main`: what a staleness bound buys (the run's
virtual time) and what it costs (older gradients, a higher loss)."""
import re
from argparse import Namespace

import numpy as np

from .draw import COLOURS, Picture, load_script, printed

ROW = re.compile(r"s = (\d): virtual time +([0-9.]+), mean staleness ([0-9.]+) rounds, final loss ([0-9.]+)")


def staleness(quick):
    """staleness.py's `main` on 4 thread ranks (a server and 3 workers, 60 rounds; --quick: 30), its rows
    as it prints them: (s, virtual time, mean staleness, final loss)."""
    script = load_script("13_local_sgd_and_staleness/staleness.py")
    text = printed(script.main, Namespace(steps=30 if quick else 60), threads=4)[1]
    return [(int(s), float(t), float(lag), float(loss)) for s, t, lag, loss in ROW.findall(text)], text


def draw_staleness(plt, rows):
    bounds, times, lags, losses = (np.array([r[i] for r in rows]) for i in range(4))
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(7, 3.3))
    left.bar(x, times, 0.6, color=COLOURS["forward"])
    for k, (t, lag) in enumerate(zip(times, lags)):
        left.text(k, t, f"{t:.0f}\n{lag:.2f} rounds\nstale (mean)", ha="center", va="bottom", fontsize=6.5)
    left.set_ylim(0, times.max() * 1.35)
    left.set_ylabel("virtual time of the run", fontsize=8)
    right.plot(x, losses, "o-", color=COLOURS["backward"], lw=1.5)
    for k, loss in enumerate(losses):
        right.annotate(f"{loss:.3f}", (k, loss), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    right.set_ylabel("final loss (last 5 global batches)", fontsize=8)
    for ax in (left, right):
        ax.set_xticks(x, [f"s = {s}" for s in bounds], fontsize=8)
        ax.set_xlabel("staleness bound (rounds a worker may run ahead)", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    left.set_title("the run ends sooner: no one waits for a straggler", fontsize=8)
    right.set_title("the loss ends higher: older gradients are worse ones", fontsize=8)
    right.margins(y=0.2)
    fig.suptitle("a parameter server and 3 workers, one round in five of each 4× longer (scripted, a virtual clock)",
                 fontsize=8)
    fig.tight_layout()
    return fig


PICTURES = [Picture("staleness", "13_local_sgd_and_staleness", staleness, draw_staleness)]
