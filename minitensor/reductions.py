"""Differentiable reductions: sum, mean and max over axes, with keepdims.

Backward puts the reduced axes back (size 1) and broadcasts the gradient over them.
Each takes numpy's spelling (`axis=`, `keepdims=`) or PyTorch's (`dim=`, `keepdim=`).
"""
import math
from collections import namedtuple

import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function
from minitensor.tensor import Tensor

# What `max(dim=d)` returns, as `torch.max` does: the maxima and where they are.
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


def _axis_and_keepdims(op, a, axis, keepdims, dim, keepdim):
    """One (axis, keepdims) from either spelling, each axis checked against `a`'s dims."""
    if dim is not None and axis is not None:
        raise TypeError(f"{op}: got axis={axis} and dim={dim}; give one (axis is numpy's name, dim PyTorch's)")
    if keepdim is not None and keepdims:
        raise TypeError(f"{op}: got keepdims={keepdims} and keepdim={keepdim}; give one")
    axis = axis if dim is None else dim
    n = a.ndim or 1  # a 0-d tensor accepts axis 0 and -1, as in PyTorch
    for ax in () if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else axis:
        if not -n <= ax < n:
            raise IndexError(f"{op}: axis {ax} is out of range for a tensor of shape {a.shape}")
    return axis, (keepdims if keepdim is None else keepdim)


def _normalize_axis(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axes) if ndim else ()


def _expand_reduced(grad, axes, keepdims):
    """Reinsert the reduced axes (size 1) so `grad` broadcasts against the input."""
    return grad if keepdims else np.expand_dims(grad, axes)


class Sum(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.shape, self.axes, self.keepdims = a.shape, _normalize_axis(axis, a.ndim), keepdims
        return dtypes.sum(a, axis=self.axes, keepdims=keepdims)

    def backward(self, grad):
        return np.broadcast_to(_expand_reduced(grad, self.axes, self.keepdims), self.shape)


class Max(Function):
    """Ties share the gradient equally (the subgradient numpy's `amax` suggests)."""

    def forward(self, a, axis=None, keepdims=False):
        self.axes, self.keepdims = _normalize_axis(axis, a.ndim), keepdims
        out = np.max(a, axis=self.axes, keepdims=True)
        self.winners = a == out
        return out if keepdims else np.squeeze(out, axis=self.axes)

    def backward(self, grad):
        grad = _expand_reduced(grad, self.axes, self.keepdims)
        count = self.winners.sum(axis=self.axes, keepdims=True, dtype=grad.dtype)  # not int64: no upcast
        return self.winners * (grad / count)


def sum(a, axis=None, keepdims=False, *, dim=None, keepdim=None):
    axis, keepdims = _axis_and_keepdims("sum", a, axis, keepdims, dim, keepdim)
    return Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(a, axis=None, keepdims=False, *, dim=None, keepdim=None):
    axis, keepdims = _axis_and_keepdims("mean", a, axis, keepdims, dim, keepdim)
    count = math.prod(a.shape[i] for i in _normalize_axis(axis, a.ndim))
    return Sum.apply(a, axis=axis, keepdims=keepdims) * (1.0 / count)


def max(a, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """The maxima; with PyTorch's `dim=` (one int), `(values, indices)` as `torch.max` returns."""
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError(f"max: dim must be one int (it returns values and indices along it), got {dim!r}")
    axis, keepdims = _axis_and_keepdims("max", a, axis, keepdims, dim, keepdim)
    values = Max.apply(a, axis=axis, keepdims=keepdims)
    if dim is None:
        return values
    return ValuesIndices(values, Tensor(np.argmax(a.data, axis=dim, keepdims=keepdims)))
