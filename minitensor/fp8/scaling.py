"""Scaling: how each tensor is brought into FP8's narrow range before the cast.

A format holds |q| ≤ max (448 for e4m3fn) with 3 mantissa bits, and values below its
smallest subnormal (2⁻⁹) flush to zero. So a tensor x is stored as q = saturate(x·s) with
a scale s, and read back as x̂ = q / s. The scale maps the tensor's largest magnitude,
its amax, onto the format's largest value (Transformer Engine's formula, with a margin
of 2^margin head-room):

    s = max_fmt / amax / 2^margin        (amax = 0 or not finite: keep the previous s)

Where the amax comes from is the recipe:

    current (per tensor)   the amax of the tensor being cast: exact, but the whole tensor
                           must be read (and, split over ranks, all-reduced) before the cast.
    delayed (per tensor)   the amax predicted from the last `history` steps' amaxes (their
                           max, or the most recent): Transformer Engine's DelayedScaling.
                           The cast needs no pass over the tensor first; each step records
                           its amax, and the history rolls once per optimizer step.
    blockwise              DeepSeek-V3 §3.3.1: each 1×t tile of an activation or gradient
                           (t consecutive elements along the product's contraction axis)
                           and each t×t block of a weight has the scale of its own amax
                           (current scaling, t = 128 there). An outlier then spends the
                           range of its tile only, not of the whole tensor.

A product contracts over K; a scale that is constant along a stretch of K can be pulled
out of that stretch's partial sum (gemm.py), which is why the tiles run along K.
"""
from dataclasses import dataclass

import numpy as np

from .formats import saturate

AMAX_COMPUTE = ("max", "most_recent")


def scale_from_amax(amax, fmt, margin=0, previous=1.0):
    """max_fmt / amax / 2^margin, elementwise; where amax is 0 or not finite (or so small that
    the scale overflows), `previous`."""
    amax = np.asarray(amax, dtype=np.float64)
    ok = np.isfinite(amax) & (amax > fmt.max / np.finfo(np.float64).max)
    scale = fmt.max / np.where(ok, amax, 1.0) / 2.0**margin
    return np.where(ok, scale, previous)


@dataclass
class Quantized:
    """An FP8 operand of a product that contracts over its last axis: q (R, K) in FP8 and the
    scale of each row's tiles of `tile` elements along K, shape (R or 1, ⌈K/tile⌉); per
    tensor, tile = K and scale is (1, 1). The values stand for q / scale."""

    q: np.ndarray
    scale: np.ndarray
    tile: int

    def dequantize(self, dtype):
        """q / scale in `dtype` (float64 for a reference: every FP8 value and quotient is exact or
        rounded once)."""
        expanded = np.repeat(self.scale.astype(dtype), self.tile, axis=1)[:, :self.q.shape[1]]
        return self.q.astype(dtype) / expanded


def per_tensor(x, scale, fmt):
    """x (R, K) cast with one scale: a Quantized with one tile spanning K."""
    return Quantized(saturate(x * x.dtype.type(scale), fmt), np.full((1, 1), scale), x.shape[1])


def padded(x, rows, cols):
    """x (R, K) zero-padded up to multiples of `rows` and `cols` (its tiles' shape)."""
    out = np.zeros((-(-x.shape[0] // rows) * rows, -(-x.shape[1] // cols) * cols), x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def tiled(x, tile):
    """x (R, K) zero-padded to a multiple of `tile` and viewed as (R, ⌈K/tile⌉, tile)."""
    out = padded(x, 1, tile)
    return out.reshape(x.shape[0], out.shape[1] // tile, tile)  # no -1: R = 0 rows (an expert without tokens)


def quantize_tiles(x, tile, fmt):
    """x (R, K) in 1×tile tiles along K (the last may be short), each cast with the scale of its
    own amax: a Quantized whose scale is (R, ⌈K/tile⌉)."""
    # exercise 23.1: quantize one row of tiles with their scales
    # hint: view x as (R, n_tiles, tile) (`tiled`), take each tile's amax over its last axis, turn
    # hint: the amaxes into scales (scale_from_amax), multiply every element by its tile's scale,
    # hint: saturate into fmt and cut the padding off again.
    tiles = tiled(x, tile)
    scale = scale_from_amax(np.abs(tiles).max(axis=2), fmt)
    q = saturate(tiles * scale[:, :, None].astype(x.dtype), fmt)
    # end exercise
    return Quantized(q.reshape(x.shape[0], q.shape[1] * tile)[:, :x.shape[1]], scale, tile)


def quantize_blocks(w, tile, fmt):
    """w (N, K) in tile×tile blocks (edge blocks may be short), each cast with the scale of its
    own amax. Returns (q, block scales (⌈N/tile⌉, ⌈K/tile⌉))."""
    blocks = padded(w, tile, tile)
    n_blocks, k_blocks = blocks.shape[0] // tile, blocks.shape[1] // tile
    scale = scale_from_amax(np.abs(blocks).reshape(n_blocks, tile, k_blocks, tile).max(axis=(1, 3)), fmt)
    expanded = np.repeat(np.repeat(scale, tile, axis=0), tile, axis=1)[:w.shape[0], :w.shape[1]]
    return saturate(w * expanded.astype(w.dtype), fmt), scale


def block_operand(q, block_scale, tile):
    """A block-quantized matrix as a Quantized: each row's tiles take its block row's scales."""
    return Quantized(q, np.repeat(block_scale, tile, axis=0)[:q.shape[0]], tile)


def max_over(groups, amax):
    """The MAX of `amax` (an array, in place) over the ranks of each group: the amax of the whole
    tensor whose parts (or replicas) those ranks hold. A MAX is exact in any order, so every
    layout gets the one device's value bit for bit."""
    for group in groups:
        group.all_reduce(amax, op="max")
    return amax


class DelayedScale:
    """One tensor's scale under delayed scaling (Transformer Engine's DelayedScaling):
    `observe` records the amax of each use during a step; `update`, once per optimizer step
    (after the ranks that hold parts of the tensor took the MAX of their amaxes), rolls the
    step's amax into the history and sets the scale the next step casts with."""

    def __init__(self, fmt, history=16, margin=0, amax_compute="max"):
        self.fmt, self.margin, self.amax_compute = fmt, margin, amax_compute
        self.scale = 1.0
        self.history = np.zeros(history)  # the last `history` steps' amaxes, newest last
        self.amax = 0.0  # this step's amax so far

    def observe(self, amax):
        self.amax = float(np.maximum(self.amax, amax))  # NaN propagates: the update then keeps the scale

    def scale_for(self, amax):
        """The scale to cast with now (the history's), after recording this use's amax."""
        self.observe(amax)
        return self.scale

    def update(self):
        # exercise 23.2: the delayed-scale update
        # hint: roll the history one place towards the front and write this step's amax last; the
        # hint: amax to use is the history's max ("max") or its newest entry ("most_recent");
        # hint: scale_from_amax with the margin, keeping the old scale where the amax is 0 or not finite.
        self.history = np.roll(self.history, -1)
        self.history[-1] = self.amax
        amax = self.history.max() if self.amax_compute == "max" else self.history[-1]
        self.scale = float(scale_from_amax(amax, self.fmt, self.margin, self.scale))
        # end exercise
        self.amax = 0.0

    def state_dict(self):
        return {"scale": self.scale, "history": self.history.tolist(), "amax": self.amax}

    def load_state_dict(self, state):
        if len(state["history"]) != len(self.history):
            raise ValueError(f"DelayedScale: a history of {len(state['history'])} amaxes for one of "
                             f"{len(self.history)}")
        self.scale, self.history, self.amax = float(state["scale"]), np.array(state["history"]), float(state["amax"])
