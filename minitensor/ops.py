"""Differentiable binary ops (arithmetic, pow, matmul, where) and casts, each forward beside
its backward.

Binary ops broadcast like numpy and promote dtypes like PyTorch (minitensor.promotion);
their backward sums the gradient back to each input's shape in one helper, `unbroadcast`
(minitensor.operands, with the other helpers that ready an op's operands).
"""

import math

import numpy as np

from minitensor import binary_math, comparison, dtypes, promotion
from minitensor.autograd import Function
from minitensor.errors import ShapeError
from minitensor.kernel_threads import stacked_matmul
from minitensor.operands import as_tensor, binary_operands, dtype_mismatch, floating, unbroadcast
from minitensor.tensor import Tensor


def _rows(x):
    """(..., n) as the matrix of its rows (rows, n); the row count is explicit, because
    reshape(-1, 0) is ambiguous for an empty tensor."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


class Add(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, grad):
        return unbroadcast(grad, self.shapes[0]), unbroadcast(grad, self.shapes[1])


class Sub(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, grad):
        return unbroadcast(grad, self.shapes[0]), unbroadcast(-grad, self.shapes[1])


class Mul(Function):
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * b

    def backward(self, grad):
        a, b = self.saved
        return unbroadcast(grad * b, a.shape), unbroadcast(grad * a, b.shape)


class Div(Function):
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a / b

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad / b
        return unbroadcast(grad_a, a.shape), unbroadcast(-grad_a * a / b, b.shape)


class Pow(Function):
    """y = aᵖ for a number p.  da = p·aᵖ⁻¹ (0 for p = 0, also at a = 0, as in PyTorch)."""

    def forward(self, a, exponent):
        self.save_for_backward(a)
        self.exponent = exponent
        return a**exponent

    def backward(self, grad):
        (a,) = self.saved
        if self.exponent == 0:
            return np.zeros_like(grad)
        return grad * self.exponent * a ** (self.exponent - 1)


class PowTensor(Function):
    """y = aᵇ elementwise.  da = b·aᵇ⁻¹ (0 where b = 0);  db = y·ln a (0 where a = 0 and b ≥ 0,
    the limit PyTorch takes)."""

    def forward(self, a, b):
        y = np.power(a, b)
        self.save_for_backward(a, b, y)
        return y

    def backward(self, grad):
        a, b, y = self.saved
        with np.errstate(divide="ignore", invalid="ignore"):
            da = np.where(b == 0, 0, grad * b * np.power(a, b - 1))
            db = np.where((a == 0) & (b >= 0), 0, grad * y * np.log(a))
        return unbroadcast(da, a.shape), unbroadcast(db, b.shape)


class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, grad):
        return -grad


class MatMul(Function):
    """`a @ b` with numpy's batching rules. `(..., K) @ (K, N)` runs as one 2-D GEMM."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        if b.ndim == 2:
            return dtypes.matmul(_rows(a), b).reshape(*a.shape[:-1], b.shape[-1])
        return stacked_matmul(a, b)  # a stack of small products (attention's heads): see kernel_threads

    def backward(self, grad):
        return self.backward_parts(grad, (True, True))

    def backward_parts(self, grad, wanted):
        """dA and/or dB as flagged in `wanted` (None for the other): a split backward asks
        for the input's now and the weight's later (minitensor.split_backward)."""
        # exercise 01.1: MatMul backward
        # hint: Y = A B gives dA = dY Bᵀ and dB = Aᵀ dY (each only if `wanted`, else None). With a 2-D b,
        # hint: reshape a and grad to 2-D first; otherwise swap the last two axes, multiply with stacked_matmul
        # hint: (as forward does: the same result as dtypes.matmul, faster) and unbroadcast each gradient.
        a, b = self.saved
        if b.ndim == 2:  # dA = dY Bᵀ; dB = Aᵀ dY, both as single GEMMs over all rows
            a2, g2 = _rows(a), _rows(grad)
            return (dtypes.matmul(g2, b.T).reshape(a.shape) if wanted[0] else None,
                    dtypes.matmul(a2.T, g2) if wanted[1] else None)
        grad_a = unbroadcast(stacked_matmul(grad, np.swapaxes(b, -1, -2)), a.shape) if wanted[0] else None
        grad_b = unbroadcast(stacked_matmul(np.swapaxes(a, -1, -2), grad), b.shape) if wanted[1] else None
        return grad_a, grad_b
        # end exercise


class Cast(Function):
    """A change of dtype; the gradient goes back in the input's dtype."""

    def forward(self, a, dtype):
        self.dtype = a.dtype
        return a.astype(dtype)

    def backward(self, grad):
        return grad.astype(self.dtype)


class Where(Function):
    """`where(cond, a, b)`; `cond` is a boolean numpy array (no gradient)."""

    def forward(self, a, b, cond):
        self.cond, self.shapes = cond, (a.shape, b.shape)
        return np.where(cond, a, b)

    def backward(self, grad):
        zero = np.zeros((), grad.dtype)
        return (
            unbroadcast(np.where(self.cond, grad, zero), self.shapes[0]),
            unbroadcast(np.where(self.cond, zero, grad), self.shapes[1]),
        )


def add(a, b):
    return Add.apply(*binary_operands("add", a, b))


def sub(a, b):
    return Sub.apply(*binary_operands("sub", a, b))


def mul(a, b):
    return Mul.apply(*binary_operands("mul", a, b))


def div(a, b, *, rounding_mode=None):
    """True division: integers divide into the default float dtype, as in PyTorch; with
    `rounding_mode` 'trunc' or 'floor', the quotient rounded (minitensor.binary_math)."""
    if rounding_mode is not None:
        return binary_math.rounded_div(a, b, rounding_mode)
    a, b = binary_operands("div", a, b)
    if not dtypes.is_floating(a.dtype):
        a, b = floating("div", a, b)
    return Div.apply(a, b)


def pow(a, exponent):
    """a ** exponent. A number as the exponent keeps the one-input kernel (the GPT's path);
    a tensor exponent, or a number as the base (`2 ** x`), runs the elementwise PowTensor."""
    if isinstance(exponent, (Tensor, np.ndarray, list)) or not isinstance(a, Tensor):
        return PowTensor.apply(*binary_operands("pow", a, exponent))
    if not np.isscalar(exponent):
        raise TypeError(f"pow: the exponent must be a number or a tensor, got {type(exponent).__name__}")
    if isinstance(exponent, np.generic):  # a numpy float64 scalar would upcast a float32 tensor
        exponent = exponent.item()
    dtype = promotion.result_type("pow", a.data, exponent)
    return Pow.apply(a if dtype == a.dtype else cast(a, dtype), exponent=exponent)


def neg(a):
    return Neg.apply(a)


def matmul(a, b):
    """a @ b with PyTorch's rules: a 1-d operand is a matrix of one row (left) or one column
    (right) whose added dim is removed from the result."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: both operands need at least 1 dim, got shapes {a.shape} and {b.shape}")
    if a.ndim == 1 or b.ndim == 1:
        out = matmul(a.reshape(1, -1) if a.ndim == 1 else a, b.reshape(-1, 1) if b.ndim == 1 else b)
        return out.reshape(out.shape[:-2] + out.shape[-2:-1] * (a.ndim > 1) + out.shape[-1:] * (b.ndim > 1))
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not fit (need (..., n, k) @ (..., k, m))")
    if a.dtype != b.dtype:
        raise dtype_mismatch("matmul", a, b)
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul: batch dims of {a.shape} and {b.shape} cannot be broadcast") from None
    return MatMul.apply(a, b)


def cast(a, dtype):
    """`a` in `dtype`; a cast to an integer or bool dtype leaves the graph (no gradient)."""
    dtype = np.dtype(dtype)
    if not dtypes.is_floating(dtype):
        return comparison.discrete(lambda x: x.astype(dtype), a)
    return Cast.apply(a, dtype=dtype)


def where(cond, a, b):
    """a where `cond` (a bool tensor or array) is True, else b; a and b may be numbers."""
    cond = np.asarray(cond.data if isinstance(cond, Tensor) else cond, dtype=bool)
    a, b = binary_operands("where", a, b)
    try:
        np.broadcast_shapes(cond.shape, a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"where: condition {cond.shape} does not broadcast with {a.shape} and {b.shape}") from None
    return Where.apply(a, b, cond=cond)


def masked_fill(a, mask, value):
    """Positions where `mask` is True take `value` (in a's dtype); the gradient flows only elsewhere."""
    value = cast(value, a.dtype) if isinstance(value, Tensor) else Tensor(np.asarray(value).astype(a.dtype))
    return where(mask, value, a)
