"""Differentiable scans (running reductions along one dim): cumsum and cumprod.

y keeps x's shape; yₖ reduces x₀ … xₖ. Each takes PyTorch's `dim` (required) and `dtype=`.
"""
import numpy as np

from minitensor import dtypes, shape_ops
from minitensor.autograd import Function
from minitensor.tensor import Tensor


class CumSum(Function):
    """yₖ = Σ_{i≤k} xᵢ;  dxᵢ = Σ_{k≥i} dyₖ, the running sum of dy from the end."""

    def forward(self, x, axis):
        self.axis = axis
        return np.cumsum(x, axis=axis)

    def backward(self, grad):
        return np.flip(np.cumsum(np.flip(grad, self.axis), axis=self.axis), self.axis)


class CumProd(Function):
    """yₖ = Π_{i≤k} xᵢ;  dxᵢ = Σ_{k≥i} dyₖ·Π_{j≤k, j≠i} xⱼ = Pᵢ·Sᵢ, with Pᵢ = Π_{j<i} xⱼ
    and Sᵢ = dyᵢ + x_{i+1}·S_{i+1} (a recurrence from the end). No division by xᵢ, so
    zeros among the x are exact."""

    def forward(self, x, axis):
        self.save_for_backward(x)
        self.axis = axis
        return np.cumprod(x, axis=axis)

    def backward(self, grad):
        x, grad = np.moveaxis(self.saved[0], self.axis, -1), np.moveaxis(grad, self.axis, -1)
        before = np.ones_like(x)
        before[..., 1:] = np.cumprod(x[..., :-1], axis=-1)
        s = np.empty_like(grad)
        for i in reversed(range(x.shape[-1])):
            s[..., i] = grad[..., i] + (x[..., i + 1] * s[..., i + 1] if i + 1 < x.shape[-1] else 0)
        return np.moveaxis(before * s, -1, self.axis)


def _scan_input(op, a, dim, dtype):
    if not isinstance(a, Tensor):
        a = Tensor(a)
    if dtype is not None:
        a = a.to(dtype)
    elif not dtypes.is_floating(a.dtype):  # integers and bools accumulate in int64, as in PyTorch
        a = a.to(np.int64)
    return (a.reshape(1) if a.ndim == 0 else a), shape_ops.check_dim(op, dim, a.ndim or 1, a.shape)


def _scan(cls, op, a, dim, dtype):
    x, axis = _scan_input(op, a, dim, dtype)
    y = cls.apply(x, axis=axis)
    return y.reshape(()) if np.ndim(a.data if isinstance(a, Tensor) else a) == 0 else y


def cumsum(a, dim, *, dtype=None):
    return _scan(CumSum, "cumsum", a, dim, dtype)


def cumprod(a, dim, *, dtype=None):
    return _scan(CumProd, "cumprod", a, dim, dtype)
