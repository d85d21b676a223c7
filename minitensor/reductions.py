"""Differentiable reductions: sum, mean, prod, max/min (amax/amin), and the index and truth
reductions argmax/argmin, any/all (no gradient). var/std/logsumexp are in statistics,
cumsum/cumprod in scans.

Backward puts the reduced axes back (size 1) and broadcasts the gradient over them.
Each takes PyTorch's spelling (`dim=`, `keepdim=`) or numpy's (`axis=`, `keepdims=`).
"""
import math
from collections import namedtuple

import numpy as np

from minitensor import comparison, dtypes, ops
from minitensor.autograd import Function
from minitensor.tensor import Tensor

# What `max(dim)` returns, as `torch.max` does: the maxima and where they are.
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


def axis_and_keepdims(op, a, dim, keepdim, axis=None, keepdims=None):
    """One (axis, keepdims) from either spelling, each axis checked against `a`'s dims."""
    if dim is not None and axis is not None:
        raise TypeError(f"{op}: got axis={axis} and dim={dim}; give one (axis is numpy's name, dim PyTorch's)")
    if keepdims is not None and keepdim:
        raise TypeError(f"{op}: got keepdims={keepdims} and keepdim={keepdim}; give one")
    axis = axis if dim is None else dim
    n = a.ndim or 1  # a 0-d tensor accepts axis 0 and -1, as in PyTorch
    for ax in () if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else axis:
        if not -n <= ax < n:
            raise IndexError(f"{op}: axis {ax} is out of range for a tensor of shape {a.shape}")
    return axis, bool(keepdim if keepdims is None else keepdims)


def normalize_axis(axis, ndim):
    """The reduced axes as a tuple of non-negative ints (all of them for None)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(int(a) % ndim for a in axes) if ndim else ()


def expand_reduced(grad, axes, keepdims):
    """Reinsert the reduced axes (size 1) so `grad` broadcasts against the input."""
    return grad if keepdims else np.expand_dims(grad, axes)


class Sum(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.shape, self.axes, self.keepdims = a.shape, normalize_axis(axis, a.ndim), keepdims
        return dtypes.sum(a, axis=self.axes, keepdims=keepdims)

    def backward(self, grad):
        return np.broadcast_to(expand_reduced(grad, self.axes, self.keepdims), self.shape)


class Max(Function):
    """amax: ties share the gradient equally (the subgradient PyTorch's `amax` and full
    `max()` use). `Min` is the same with np.min."""

    reduce = staticmethod(np.max)

    def forward(self, a, axis=None, keepdims=False):
        self.axes, self.keepdims = normalize_axis(axis, a.ndim), keepdims
        out = self.reduce(a, axis=self.axes, keepdims=True)
        self.winners = a == out
        return out if keepdims else np.squeeze(out, axis=self.axes)

    def backward(self, grad):
        grad = expand_reduced(grad, self.axes, self.keepdims)
        count = self.winners.sum(axis=self.axes, keepdims=True, dtype=grad.dtype)  # not int64: no upcast
        return self.winners * (grad / count)


class Min(Max):
    reduce = staticmethod(np.min)


class TakeAlong(Function):
    """y = x at `index` along `axis` (index has x's shape with size 1 there): what max(dim)
    and min(dim) return. The gradient goes to the picked element only, as in PyTorch."""

    def forward(self, x, index, axis, keepdims):
        self.shape, self.index, self.axis, self.keepdims = x.shape, index, axis, keepdims
        y = np.take_along_axis(x, index, axis=axis)
        return y if keepdims else np.squeeze(y, axis=axis)

    def backward(self, grad):
        dx = np.zeros(self.shape, grad.dtype)
        np.put_along_axis(dx, self.index, expand_reduced(grad, self.axis, self.keepdims), axis=self.axis)
        return dx, None


class Prod(Function):
    """y = Π xᵢ along `axis`;  dy/dxᵢ = Π_{j≠i} xⱼ, taken as (product of the x before i) ·
    (product of those after i): exact when some xⱼ is 0, where y/xᵢ would divide by zero."""

    def forward(self, x, axis, keepdims):
        self.save_for_backward(x)
        self.axis, self.keepdims = axis, keepdims
        return np.prod(x, axis=axis, keepdims=keepdims)

    def backward(self, grad):
        x = np.moveaxis(self.saved[0], self.axis, -1)
        before, after = np.ones_like(x), np.ones_like(x)
        before[..., 1:] = np.cumprod(x[..., :-1], axis=-1)
        after[..., :-1] = np.cumprod(x[..., :0:-1], axis=-1)[..., ::-1]
        return np.moveaxis(before * after, -1, self.axis) * expand_reduced(grad, self.axis, self.keepdims)


def _check_nonempty(op, a, axes):
    if 0 in [a.shape[ax] for ax in axes]:  # (the module's own `any` shadows the builtin)
        raise IndexError(f"{op}: cannot reduce over an empty dim (shape {a.shape}, dims {axes}): it has no {op}")


def sum(a, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):
    """Σ over `dim` (all dims if None). Integers and bools add up in int64, as in PyTorch."""
    axis, keepdims = axis_and_keepdims("sum", a, dim, keepdim, axis, keepdims)
    a = a if dtype is None else a.to(dtype)
    return Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(a, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):
    """Σ/n over `dim`; NaN over an empty dim (0/0), as in PyTorch. Floats only: an integer
    tensor needs `dtype=` or `.float()` first (PyTorch's rule)."""
    axis, keepdims = axis_and_keepdims("mean", a, dim, keepdim, axis, keepdims)
    a = a if dtype is None else a.to(dtype)
    if not dtypes.is_floating(a.dtype):
        raise TypeError(f"mean: needs a floating dtype, got {a.dtype}; pass dtype=mt.float32 or call .float()")
    count = math.prod(a.shape[i] for i in normalize_axis(axis, a.ndim))
    return Sum.apply(a, axis=axis, keepdims=keepdims) * (1.0 / count if count else math.nan)


def _extreme(op, cls, arg, a, dim, keepdim, axis, keepdims):
    """max or min: over `axis` (numpy's spelling) the values; over one `dim` (PyTorch's)
    (values, indices); with a tensor as `dim`, the elementwise maximum/minimum."""
    if isinstance(dim, Tensor):
        from minitensor import activations  # the elementwise form: torch.max(a, b)
        return getattr(activations, {"max": "maximum", "min": "minimum"}[op])(a, dim)
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{op}: dim must be one int (it returns values and indices along it), got {dim!r}")
    axis, keepdims = axis_and_keepdims(op, a, dim, keepdim, axis, keepdims)
    _check_nonempty(op, a, normalize_axis(axis, a.ndim))
    if dim is None:
        return cls.apply(a, axis=axis, keepdims=keepdims)
    if a.ndim == 0:
        return ValuesIndices(a.reshape(()), Tensor(np.int64(0)))
    index = _arg(op, arg, a, dim, True)
    values = TakeAlong.apply(a, index, axis=dim % a.ndim, keepdims=keepdims)
    return ValuesIndices(values, index if keepdims else index.squeeze(dim))


def max(a, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The maxima; with `dim` (one int, PyTorch's `x.max(1)`), `(values, indices)`."""
    return _extreme("max", Max, np.argmax, a, dim, keepdim, axis, keepdims)


def min(a, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The minima; with `dim` (one int), `(values, indices)`."""
    return _extreme("min", Min, np.argmin, a, dim, keepdim, axis, keepdims)


def amax(a, dim=None, keepdim=False):
    """The maxima over `dim` (an int or a tuple), ties sharing the gradient."""
    return max(a, axis=dim, keepdims=keepdim) if dim is not None else max(a, keepdims=keepdim)


def amin(a, dim=None, keepdim=False):
    return min(a, axis=dim, keepdims=keepdim) if dim is not None else min(a, keepdims=keepdim)


def _arg(op, fn, a, dim, keepdim):
    """argmax/argmin: the first index of the extreme, int64, no gradient."""
    axis, keepdim = axis_and_keepdims(op, a, dim, keepdim)
    _check_nonempty(op, a, normalize_axis(axis, a.ndim))
    if a.ndim == 0:
        return Tensor(np.int64(0))
    return comparison.discrete(lambda x: fn(x, axis=axis, keepdims=keepdim).astype(np.int64), a)


def argmax(a, dim=None, keepdim=False):
    return _arg("argmax", np.argmax, a, dim, keepdim)


def argmin(a, dim=None, keepdim=False):
    return _arg("argmin", np.argmin, a, dim, keepdim)


def prod(a, dim=None, keepdim=False, *, dtype=None):
    """Π over one `dim` (all elements if None). Integers multiply in int64, as in PyTorch."""
    axis, keepdim = axis_and_keepdims("prod", a, dim, keepdim)
    a = a if dtype is None else a.to(dtype)
    if not dtypes.is_floating(a.dtype):
        return comparison.discrete(lambda x: np.prod(x, axis=axis, keepdims=keepdim, dtype=np.int64), a)
    if axis is None:
        out = Prod.apply(a.reshape(-1), axis=0, keepdims=False)
        return out.reshape((1,) * a.ndim) if keepdim else out
    return Prod.apply(a, axis=int(axis) % (a.ndim or 1), keepdims=keepdim) if a.ndim else a * 1


def any(a, dim=None, keepdim=False):
    """True where some element along `dim` is nonzero (a bool tensor, no gradient)."""
    axis, keepdim = axis_and_keepdims("any", a, dim, keepdim)
    return comparison.discrete(lambda x: np.any(x, axis=axis, keepdims=keepdim), a)


def all(a, dim=None, keepdim=False):
    """True where every element along `dim` is nonzero (a bool tensor, no gradient)."""
    axis, keepdim = axis_and_keepdims("all", a, dim, keepdim)
    return comparison.discrete(lambda x: np.all(x, axis=axis, keepdims=keepdim), a)


def dot(a, b):
    """Σᵢ aᵢbᵢ of two 1-d tensors of one length (torch.dot): the sum of a product, computed as
    the 1-d @ 1-d matmul."""
    a, b = (x if isinstance(x, Tensor) else Tensor(np.asarray(x)) for x in (a, b))
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"dot: needs two 1-d tensors of one length, got shapes {a.shape} and {b.shape}")
    return ops.matmul(a, b)
