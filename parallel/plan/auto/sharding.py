"""How one value lies over a 1-D tensor-parallel group of n ranks, and what changing it costs.

Three kinds of layout (GSPMD's / Alpa's vocabulary):
    R     replicated: every rank holds the whole value
    S(d)  split: rank r holds the r-th of n equal slices along dimension d
    P     partial: every rank holds a whole-shaped value; the true value is their sum

Turning one layout into another is a collective (or nothing), on a value of N bytes in total:
    P → R     all-reduce           2(n−1)(α + N/n·β)
    P → S(d)  reduce-scatter        (n−1)(α + N/n·β)
    S(d) → R  all-gather            (n−1)(α + N/n·β)
    S(d) → S(e)  all-to-all         (n−1)(α + N/n²·β)   each rank keeps 1/n of its slice
    R → S(d), R → P, S(d) → P   free: slice locally; keep the value on rank 0 (zeros elsewhere)
The α–β formulas are the planner's own (parallel/plan/cost.py), so the search and the
whole-model estimate price a collective alike.
"""
import re
from functools import cache

from ...alpha_beta import all_gather, ring_all_reduce

REPLICATED, PARTIAL = "R", "P"
_SPLIT = re.compile(r"S\((\d+)\)")


def split(dim):
    return f"S({dim})"


@cache
def split_dim(layout):
    """d of S(d); None for R and P."""
    match = _SPLIT.fullmatch(layout)
    return int(match.group(1)) if match else None


def layouts_of(shape, tp):
    """Every layout a value of `shape` can take over tp ranks: R, P, and S(d) for each
    dimension tp divides into equal slices."""
    return [REPLICATED, PARTIAL] + [split(d) for d, size in enumerate(shape) if size % tp == 0]


def gradient_layout(layout):
    """The layout a value's gradient must reach in the backward pass: a replicated or a
    partial value's gradient is whole on every rank (R); a split value's is split alike."""
    return layout if split_dim(layout) is not None else REPLICATED


def join(a, b):
    """Two gradient contributions of one value, summed: alike stay alike; otherwise both
    become partial sums first (R → P and S → P are free), and their sum is partial."""
    if a is None or a == b:
        return b
    return PARTIAL


def collective(source, target):
    """The collective that turns `source` into `target`: None (free), or its name."""
    if source == target or source == REPLICATED or target == PARTIAL:
        return None
    if source == PARTIAL:
        return "all-reduce" if target == REPLICATED else "reduce-scatter"
    return "all-gather" if target == REPLICATED else "all-to-all"


def reshard_seconds(source, target, nbytes, tp, alpha, beta):
    """Seconds of `collective(source, target)` on a value of `nbytes` (the α–β model)."""
    # exercise 19.1: the cost of changing a layout
    # hint: collective(source, target) names it; all-reduce and all-gather / reduce-scatter are the
    # hint: planner's ring_all_reduce and all_gather; an all-to-all sends (n − 1) messages of nbytes/n² bytes.
    kind = collective(source, target)
    if kind is None or tp == 1:
        return 0.0
    if kind == "all-reduce":
        return ring_all_reduce(tp, nbytes, alpha, beta)
    if kind == "all-to-all":
        return (tp - 1) * (alpha + nbytes / tp ** 2 * beta)
    return all_gather(tp, nbytes, alpha, beta)
    # end exercise
