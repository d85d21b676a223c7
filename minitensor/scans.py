"""Differentiable scans (running reductions along one dim): cumsum, cumprod, cummax, cummin.

y keeps x's shape; yₖ reduces x₀ … xₖ. Each takes PyTorch's `dim` (required); cumsum and
cumprod take `dtype=`, cummax and cummin give `(values, indices)`.
"""
import numpy as np

from minitensor import dtypes, shape_ops
from minitensor.autograd import Function
from minitensor.indexing import Gather
from minitensor.reductions import ValuesIndices
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


def _running_extreme_index(x, axis, accumulate):
    """Where each running extreme yₖ was taken: the LAST i ≤ k with xᵢ = yᵢ (a tie moves
    the index on, as PyTorch's cummax does), or with xᵢ NaN (NaN wins and stays). Since
    y changes only at such an i, that i's value is yₖ."""
    running = accumulate(x, axis=axis)
    hit = (x == running) | (x != x)
    positions = np.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - 1 - axis))
    return np.maximum.accumulate(np.where(hit, positions, 0), axis=axis)


def _cumulative_extreme(op, accumulate, a, dim):
    a = a if isinstance(a, Tensor) else Tensor(a)
    x = a.reshape(1) if a.ndim == 0 else a
    axis = shape_ops.check_dim(op, dim, a.ndim or 1, a.shape)
    index = _running_extreme_index(x.data, axis, accumulate)
    values = Gather.apply(x, index=index, dim=axis)  # the gradient of yₖ goes to x at its index
    return ValuesIndices(values.reshape(a.shape), Tensor(index.reshape(a.shape)))


def cummax(a, dim):
    """`(values, indices)`: the running maximum along `dim` and where each was taken."""
    return _cumulative_extreme("cummax", np.maximum.accumulate, a, dim)


def cummin(a, dim):
    """`(values, indices)`: the running minimum along `dim` and where each was taken."""
    return _cumulative_extreme("cummin", np.minimum.accumulate, a, dim)
