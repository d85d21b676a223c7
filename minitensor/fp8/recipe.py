"""An FP8 recipe (the precision policy's `fp8`) and the per-layer scaling it gives each linear.

    current    per tensor, the scale of the tensor's own amax     x, W: e4m3; dY: e5m2
    delayed    per tensor, from an amax history (DelayedScale)    x, W: e4m3; dY: e5m2
    blockwise  1×t tiles (x, dY) and t×t blocks (W), their own    all e4m3 (DeepSeek-V3:
               amaxes                                             tiles leave e5m2's range unneeded)

Per tensor, x and W take e4m3 and the gradients e5m2 (Transformer Engine's HYBRID format:
gradients need range more than precision). Each layer's three products and the operands
they read, for y = x Wᵀ (x: (M, K) tokens × features, W: (N, K)):

    forward  y  = x Wᵀ      contracts K: x in 1×t tiles along K, W in t×t blocks
    dgrad    dx = dY W      contracts N: dY in 1×t tiles along N, W's blocks transposed
    wgrad    dW = dYᵀ x     contracts M: dYᵀ and xᵀ in 1×t tiles along the tokens

grad_factor: a rank's dY is (dp·cp)× the single device's (each replica's loss is the mean
over its own tokens; their gradients are averaged after), so a delayed dY history records
amax / grad_factor and casts with scale / grad_factor: the history is the same in every
layout, and a checkpoint's histories resume in any layout. Under gradient accumulation
HybridGPT adds the batches' gradients and divides after, so dY is the batch's own gradient:
a reference must do the same (the first steps cast with scale 1, so the gradient's
normalization is part of the recipe).
"""
from dataclasses import dataclass

import numpy as np

from .formats import E4M3, E5M2
from .scaling import (
    AMAX_COMPUTE,
    DelayedScale,
    Quantized,
    block_operand,
    max_over,
    per_tensor,
    quantize_blocks,
    quantize_tiles,
    scale_from_amax,
)

SCALINGS = ("current", "delayed", "blockwise")


@dataclass(frozen=True)
class Fp8Recipe:
    """scaling: one of SCALINGS; history, margin, amax_compute: delayed scaling's settings
    (Transformer Engine's amax_history_len, margin, amax_compute_algo); tile: t of the tiles
    and blocks (DeepSeek-V3: 128)."""

    scaling: str = "delayed"
    history: int = 16
    margin: int = 0
    amax_compute: str = "max"
    tile: int = 128

    def __post_init__(self):
        for name, ok, need in (("scaling", self.scaling in SCALINGS, f"one of {SCALINGS}"),
                               ("history", isinstance(self.history, int) and self.history >= 1, "an int ≥ 1"),
                               ("margin", isinstance(self.margin, int) and self.margin >= 0, "an int ≥ 0"),
                               ("amax_compute", self.amax_compute in AMAX_COMPUTE, f"one of {AMAX_COMPUTE}"),
                               ("tile", isinstance(self.tile, int) and self.tile >= 1, "an int ≥ 1")):
            if not ok:
                raise ValueError(f"FP8 recipe: {name}={getattr(self, name)!r} must be {need}")

    def layer(self, grad_factor=1, rows_in_any_order=False, groups=()):
        """A new layer's scaling state. rows_in_any_order: the layer's rows (tokens) arrive in an
        order and grouping the layout decides (a routed expert's), so no tile may span rows.
        groups: the ranks holding the other parts of the layer's tensors (current scaling
        MAX-reduces each cast's amax over them)."""
        if self.scaling == "blockwise":
            return BlockwiseScaling(self.tile, per_token_wgrad=rows_in_any_order)
        return TensorwiseScaling(self, grad_factor, groups)  # a per-tensor amax is a MAX: any order of rows


class CurrentScale:
    """The scale of the amax of the tensor being cast (per-tensor current scaling)."""

    def __init__(self, fmt, margin=0):
        self.fmt, self.margin = fmt, margin

    def scale_for(self, amax):
        return float(scale_from_amax(amax, self.fmt, self.margin))


def transposed(a):
    """A per-tensor operand (R, K) as its transpose (K, R): one scale, one tile spanning R (R = 0:
    an expert that got no tokens, a tile of length 1 over nothing)."""
    return Quantized(a.q.T, a.scale, max(a.q.shape[0], 1))


class TensorwiseScaling:
    """One scale per tensor for x, W and dY: current, or delayed (one DelayedScale each).

    Current scaling in a layout: a rank holds a part of the tensor one device casts (tp: a
    shard of W, of x or dY along features; dp × cp or edp: some of the tokens of x and dY), so
    each cast first takes the MAX of the parts' amaxes over `groups` (scaling.max_over: one
    small all-reduce per cast, inside forward and backward). Delayed scaling reduces the
    same amaxes over the same groups once per step instead (linear.Fp8Scales.update)."""

    def __init__(self, recipe, grad_factor=1, groups=()):
        kind = DelayedScale if recipe.scaling == "delayed" else CurrentScale
        extra = (recipe.history, recipe.margin, recipe.amax_compute) if kind is DelayedScale else (recipe.margin,)
        self.formats = {"x": E4M3, "w": E4M3, "dy": E5M2}
        self.scales = {role: kind(fmt, *extra) for role, fmt in self.formats.items()}
        self.grad_factor = grad_factor
        self.cast_groups = groups if kind is CurrentScale else ()  # delayed: reduced at the step

    def quantize(self, role, array):
        factor = self.grad_factor if role == "dy" else 1
        amax = max_over(self.cast_groups, np.array([np.abs(array).max(initial=0.0)], dtype=np.float64))
        scale = self.scales[role].scale_for(float(amax[0]) / factor) / factor
        return per_tensor(array, scale, self.formats[role])

    def forward_operands(self, x2, w):
        """(x, W) quantized, and what backward needs: both (cast once, reused transposed)."""
        x, w = self.quantize("x", x2), self.quantize("w", w)
        return x, w, (x, w)

    def dgrad_operands(self, g2, saved):
        return self.quantize("dy", g2), transposed(saved[1])

    def wgrad_operands(self, g2, saved):
        return transposed(self.quantize("dy", g2)), transposed(saved[0])

    def delayed_scales(self):
        """{role: DelayedScale} (empty under current scaling: nothing carries over a step)."""
        return {role: s for role, s in self.scales.items() if isinstance(s, DelayedScale)}


def per_token(a):
    """A (M, K) operand in 1×t tiles along K as the (K, M) operand of a product contracting
    over the M tokens: tiles of one element, each with its token's tile's scale."""
    scale = np.repeat(a.scale, a.tile, axis=1)[:, :a.q.shape[1]]
    return Quantized(a.q.T, scale.T, 1)


class BlockwiseScaling:
    """DeepSeek-V3's fine-grained scaling: every tile and block its own current scale.

    per_token_wgrad: the weight gradient's tiles run along the tokens, t consecutive rows of
    x and dY; a routed expert's rows are the tokens routed to it, grouped and ordered by the
    layout (which ranks' tokens arrive at this replica), so a tile of them holds other tokens
    than one device's. There dW = dYᵀ x reads the forward's x and the dgrad's dY tiles, which
    lie inside one token's row: one scale per (token, tile), the same in every layout."""

    def __init__(self, tile, per_token_wgrad=False):
        self.tile, self.per_token_wgrad = tile, per_token_wgrad

    def forward_operands(self, x2, w):
        q, block_scale = quantize_blocks(w, self.tile, E4M3)
        return quantize_tiles(x2, self.tile, E4M3), block_operand(q, block_scale, self.tile), (x2, q, block_scale)

    def dgrad_operands(self, g2, saved):
        _, q, block_scale = saved
        return quantize_tiles(g2, self.tile, E4M3), block_operand(q.T, block_scale.T, self.tile)

    def wgrad_operands(self, g2, saved):
        x2 = saved[0]
        if self.per_token_wgrad:
            return per_token(quantize_tiles(g2, self.tile, E4M3)), per_token(quantize_tiles(x2, self.tile, E4M3))
        return quantize_tiles(g2.T, self.tile, E4M3), quantize_tiles(x2.T, self.tile, E4M3)

    def delayed_scales(self):
        return {}
