"""Differentiable reductions: sum, mean and max over axes, with keepdims.

Backward puts the reduced axes back (size 1) and broadcasts the gradient over them.
"""
import math

import numpy as np

from minitensor.autograd import Function


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
        return np.sum(a, axis=self.axes, keepdims=keepdims)

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


def sum(a, axis=None, keepdims=False):
    return Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(a, axis=None, keepdims=False):
    count = math.prod(a.shape[i] for i in _normalize_axis(axis, a.ndim))
    return Sum.apply(a, axis=axis, keepdims=keepdims) * (1.0 / count)


def max(a, axis=None, keepdims=False):
    return Max.apply(a, axis=axis, keepdims=keepdims)
