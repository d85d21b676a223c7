"""Differentiable reductions built from moments and exponentials: var, std, logsumexp.

Each takes PyTorch's arguments (`dim=`, `keepdim=`, `correction=`) and computes in floats
(an integer input in float32, as in PyTorch).
"""
import numpy as np

from minitensor import reductions, unary_ops
from minitensor.autograd import Function
from minitensor.operands import as_floating


class Var(Function):
    """y = Σ(x − μ)² / max(0, n − c) over `axes` (c the correction: 1 is Bessel's, the
    unbiased estimate);  dy/dx = 2(x − μ) / max(0, n − c). n − c ≤ 0 gives inf or NaN,
    as in PyTorch."""

    def forward(self, x, axes, correction, keepdims):
        self.axes, self.keepdims = axes, keepdims
        n = np.prod([x.shape[a] for a in axes], dtype=np.int64)
        self.divisor = x.dtype.type(np.maximum(0, n - correction))
        with np.errstate(divide="ignore", invalid="ignore"):
            self.centered = x - x.mean(axis=axes, keepdims=True) if x.size else x
            squares = np.sum(self.centered * self.centered, axis=axes, keepdims=keepdims)
            return squares / self.divisor

    def backward(self, grad):
        with np.errstate(divide="ignore", invalid="ignore"):
            return reductions.expand_reduced(grad, self.axes, self.keepdims) * (2 * self.centered / self.divisor)


class LogSumExp(Function):
    """y = m + log Σ exp(x − m) over `axes`, with m = max x (so no exp overflows; m = 0
    where the max is ±inf);  dy/dx = exp(x − y), the softmax."""

    def forward(self, x, axes, keepdims):
        self.axes, self.keepdims = axes, keepdims
        m = np.max(x, axis=axes, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
        m = np.where(np.isfinite(m), m, 0)
        with np.errstate(divide="ignore"):
            y = m + np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))
        self.save_for_backward(x, y)
        return y if keepdims else np.squeeze(y, axis=axes)

    def backward(self, grad):
        x, y = self.saved
        return reductions.expand_reduced(grad, self.axes, self.keepdims) * np.exp(x - y)


def _correction(op, unbiased, correction):
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}: got unbiased={unbiased} and correction={correction}; give one")
    return correction if correction is not None else 1 if unbiased is None else int(bool(unbiased))


def var(a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """The variance over `dim` (all dims if None), dividing by n − correction (default 1)."""
    if isinstance(dim, bool):  # var(True): PyTorch's old positional `unbiased`
        dim, unbiased = None, dim
    axis, keepdim = reductions.axis_and_keepdims("var", a, dim, keepdim)
    a = as_floating(a)
    correction = _correction("var", unbiased, correction)
    return Var.apply(a, axes=reductions.normalize_axis(axis, a.ndim), correction=correction, keepdims=keepdim)


def std(a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """√var: the standard deviation over `dim`, dividing by n − correction (default 1)."""
    return unary_ops.sqrt(var(a, dim, unbiased, keepdim, correction=correction))


def logsumexp(a, dim, keepdim=False):
    """log Σ exp(a) over `dim` (an int or a tuple; required, as in PyTorch), stably."""
    axis, keepdim = reductions.axis_and_keepdims("logsumexp", a, dim, keepdim)
    a = as_floating(a)
    return LogSumExp.apply(a, axes=reductions.normalize_axis(axis, a.ndim), keepdims=keepdim)
