"""Differentiable ops that tile, flip, roll, copy or cut a tensor: `expand`, `repeat`, `tril`,
`triu`, `flip`, `roll`, `clone`, `contiguous`, `chunk`, `unflatten` (PyTorch's names and
arguments). Reshapes, permutes, indexing, cat/stack/split are in shape_ops.
"""
import math

import numpy as np

from minitensor.autograd import Function
from minitensor.operands import unbroadcast
from minitensor.shape_ops import check_dim, dims_from_args, reshape, split


class Expand(Function):
    """y = x broadcast to `shape` (a read-only view, as PyTorch's expand is a view).
    dx = dy summed over the dims that were added or stretched."""

    def forward(self, x, shape):
        self.shape = x.shape
        return np.broadcast_to(x, shape)

    def backward(self, grad):
        return unbroadcast(grad, self.shape)


class Repeat(Function):
    """y = x tiled `reps[d]` times along each dim d (x's shape padded with leading 1s).
    dx = dy seen as (r₀, s₀, r₁, s₁, ...) summed over the r's: each copy sends its gradient back."""

    def forward(self, x, reps):
        self.shape = x.shape
        self.padded = (1,) * (len(reps) - x.ndim) + x.shape
        return np.tile(x, reps)

    def backward(self, grad):
        pairs = tuple(n for r, s in zip(grad.shape, self.padded) for n in (r // s if s else 0, s))
        tiles = grad.reshape(pairs) if grad.size else np.zeros(pairs, grad.dtype)
        return tiles.sum(axis=tuple(range(0, len(pairs), 2))).reshape(self.shape)


class Triangle(Function):
    """y = x where `keep` (the lower or upper triangle of the last two dims), else 0.
    dx = dy where `keep`, else 0."""

    def forward(self, x, keep):
        self.keep = keep
        return np.where(keep, x, np.zeros((), x.dtype))

    def backward(self, grad):
        return np.where(self.keep, grad, np.zeros((), grad.dtype))


class Flip(Function):
    """y = x reversed along `dims`; reversing again is the inverse, so dx = flip(dy)."""

    def forward(self, x, dims):
        self.dims = dims
        return np.flip(x, dims)

    def backward(self, grad):
        return np.flip(grad, self.dims)


class Roll(Function):
    """y = x shifted cyclically by `shifts` along `dims` (all elements, flattened, if None);
    dx = dy shifted back by −shifts."""

    def forward(self, x, shifts, dims):
        self.shifts, self.dims = shifts, dims
        return np.roll(x, shifts, dims)

    def backward(self, grad):
        back = tuple(-s for s in self.shifts) if isinstance(self.shifts, tuple) else -self.shifts
        return np.roll(grad, back, self.dims)


class Clone(Function):
    """y = a fresh (C-contiguous) copy of x; dx = dy."""

    def forward(self, x):
        return np.array(x, copy=True, order="C")

    def backward(self, grad):
        return grad


def expand(a, *sizes):
    """`a` broadcast to `sizes` (−1 keeps a dim's size; new dims go in front), as `x.expand`."""
    sizes = dims_from_args(sizes)
    if len(sizes) < a.ndim:
        raise ValueError(f"expand: {len(sizes)} sizes {sizes} for a tensor of {a.ndim} dims {a.shape}")
    lead = len(sizes) - a.ndim
    if any(n < 0 for n in sizes[:lead]) or any(n < -1 for n in sizes):
        raise ValueError(f"expand: sizes {sizes} for {a.shape}: -1 only keeps an existing dim, no size is < -1")
    shape = sizes[:lead] + tuple(old if n == -1 else n for n, old in zip(sizes[lead:], a.shape))
    for d, (old, new) in enumerate(zip(a.shape, shape[lead:])):
        if new != old and old != 1:
            raise ValueError(f"expand: the size {new} of dim {lead + d} does not fit {old} "
                             f"(a dim of {a.shape} can only grow from 1)")
    return Expand.apply(a, shape=shape)


def expand_as(a, other):
    return expand(a, other.shape)


def repeat(a, *reps):
    """`a` tiled `reps[d]` times along each dim (`x.repeat(2, 3)`); at least a.ndim counts."""
    reps = dims_from_args(reps)
    if len(reps) < a.ndim:
        raise ValueError(f"repeat: {len(reps)} repeat counts {reps} for a tensor of {a.ndim} dims; give ≥ {a.ndim}")
    if any(r < 0 for r in reps):
        raise ValueError(f"repeat: repeat counts must be ≥ 0, got {reps}")
    return Repeat.apply(a, reps=tuple(int(r) for r in reps))


def _triangle(op, a, diagonal, lower):
    if a.ndim < 2:
        raise ValueError(f"{op}: needs a tensor of at least 2 dims, got shape {a.shape}")
    rows, cols = a.shape[-2:]
    keep = np.tri(rows, cols, diagonal, dtype=bool) if lower else ~np.tri(rows, cols, diagonal - 1, dtype=bool)
    return Triangle.apply(a, keep=keep)


def tril(a, diagonal=0):
    """The lower triangle of the last two dims: j − i ≤ diagonal kept, the rest 0."""
    return _triangle("tril", a, diagonal, lower=True)


def triu(a, diagonal=0):
    """The upper triangle of the last two dims: j − i ≥ diagonal kept, the rest 0."""
    return _triangle("triu", a, diagonal, lower=False)


def flip(a, *dims):
    """`a` reversed along `dims` (`torch.flip(x, (0, 1))` or `x.flip(0)`)."""
    dims = tuple(check_dim("flip", d, a.ndim or 1, a.shape) for d in dims_from_args(dims))
    if len(set(dims)) < len(dims):
        raise ValueError(f"flip: dims {dims} repeat")
    return Flip.apply(a, dims=dims if a.ndim else ())


def roll(a, shifts, dims=None):
    """`a` shifted cyclically: `shifts` (an int or a tuple) along `dims`; without dims, one
    shift (`1` or `(1,)`) of the flattened elements, the shape kept, as in PyTorch."""
    if dims is None:
        one = shifts[0] if isinstance(shifts, (tuple, list)) and len(shifts) == 1 else shifts
        if not isinstance(one, (int, np.integer)):
            raise ValueError(f"roll: without dims, shifts must be one int, got {shifts!r}")
        return Roll.apply(a, shifts=int(one), dims=None)
    shifts = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims):
        raise ValueError(f"roll: {len(shifts)} shifts {shifts} for {len(dims)} dims {dims}")
    dims = tuple(check_dim("roll", d, a.ndim or 1, a.shape) for d in dims)
    if a.ndim == 0:
        return clone(a)
    return Roll.apply(a, shifts=tuple(int(s) for s in shifts), dims=dims)


def clone(a):
    """A copy of `a` that the graph sees as an op (its gradient flows straight back)."""
    return Clone.apply(a)


def contiguous(a):
    """`a` itself if its array is C-contiguous, else a contiguous copy (as PyTorch's)."""
    return a if a.data.flags.c_contiguous else clone(a)


def chunk(a, chunks, dim=0):
    """`a` cut into `chunks` pieces of ⌈n / chunks⌉ along `dim` (the last smaller, maybe fewer pieces)."""
    if chunks < 1:
        raise ValueError(f"chunk: chunks must be ≥ 1, got {chunks}")
    if a.ndim == 0:
        raise ValueError("chunk: a 0-d tensor has no dim to cut")
    dim = check_dim("chunk", dim, a.ndim, a.shape)
    return split(a, max(math.ceil(a.shape[dim] / chunks), 1), dim)


def unflatten(a, dim, sizes):
    """Dim `dim` of `a` as several dims `sizes` (one may be −1), as `torch.unflatten`."""
    dim = check_dim("unflatten", dim, a.ndim, a.shape)
    sizes = tuple(sizes)
    known = math.prod(n for n in sizes if n != -1)
    n, free = a.shape[dim], -1 in sizes
    if sizes.count(-1) > 1 or (not free and known != n) or (free and (not known or n % known)):
        raise ValueError(f"unflatten: sizes {sizes} do not make dim {dim} of size {a.shape[dim]} of {a.shape}")
    sizes = tuple(n // known if s == -1 else s for s in sizes)  # explicit: reshape(-1) of 0 elements is ambiguous
    return reshape(a, a.shape[:dim] + sizes + a.shape[dim + 1:])
