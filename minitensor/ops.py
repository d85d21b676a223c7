"""Differentiable binary ops (arithmetic, matmul, where) and casts, each forward beside
its backward.

Binary ops broadcast like numpy; their backward sums the gradient back to each
input's shape in one helper, `unbroadcast`.
"""

import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function
from minitensor.kernel_threads import stacked_matmul
from minitensor.tensor import Tensor


def unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added or stretched, back to `shape`."""
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    stretched = tuple(leading + i for i, n in enumerate(shape) if n == 1 and grad.shape[leading + i] != 1)
    return dtypes.sum(grad, axis=tuple(range(leading)) + stretched).reshape(shape)


def as_tensor(value, like):
    """Wrap a Python scalar or array so it can meet `like` in an op, without upcasting.

    A Python number takes the tensor's dtype (so float32 stays float32); integer arrays
    meeting a float tensor are cast to it.
    """
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    if dtypes.is_floating(like.dtype) and (array.ndim == 0 or not dtypes.is_floating(array.dtype)):
        array = array.astype(like.dtype)
    return Tensor(array)


def dtype_mismatch(op, *tensors):
    """The error for tensors of different dtypes: ops never convert between float dtypes on
    their own (a float32 model must stay float32), so the message says how to convert."""
    return TypeError(f"{op}: dtypes {[str(t.dtype) for t in tensors]} differ; convert one explicitly: "
                     f"t.to(mt.float32) (or .float(), .double()) for a tensor, "
                     f"mt.tensor(array, dtype=mt.float32) for a numpy array")


def binary_operands(op, a, b):
    """Coerce both operands to tensors and check dtypes and broadcasting, naming the op."""
    a = as_tensor(a, b) if not isinstance(a, Tensor) else a
    b = as_tensor(b, a)
    floats = [dtypes.is_floating(t.dtype) for t in (a, b)]
    if all(floats) and a.dtype != b.dtype:
        raise dtype_mismatch(op, a, b)
    if floats[0] != floats[1]:  # an integer/bool tensor takes the float one's dtype (numpy would upcast)
        a, b = (a, Tensor(b.data.astype(a.dtype))) if floats[0] else (Tensor(a.data.astype(b.dtype)), b)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} cannot be broadcast together") from None
    return a, b


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
    def forward(self, a, exponent):
        self.save_for_backward(a)
        self.exponent = exponent
        return a**exponent

    def backward(self, grad):
        (a,) = self.saved
        return grad * self.exponent * a ** (self.exponent - 1)


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
            return dtypes.matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
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
            a2, g2 = a.reshape(-1, a.shape[-1]), grad.reshape(-1, grad.shape[-1])
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


def div(a, b):
    return Div.apply(*binary_operands("div", a, b))


def pow(a, exponent):
    if not np.isscalar(exponent):
        raise TypeError(f"pow: only a scalar exponent is supported, got {type(exponent).__name__}")
    if isinstance(exponent, np.generic):  # a numpy float64 scalar would upcast a float32 tensor
        exponent = exponent.item()
    return Pow.apply(a, exponent=exponent)


def neg(a):
    return Neg.apply(a)


def matmul(a, b):
    a, b = (as_tensor(a, b), b) if isinstance(b, Tensor) else (a, as_tensor(b, a))
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not fit (need (..., n, k) @ (..., k, m))")
    if a.dtype != b.dtype:
        raise dtype_mismatch("matmul", a, b)
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dims of {a.shape} and {b.shape} cannot be broadcast") from None
    return MatMul.apply(a, b)


def cast(a, dtype):
    return Cast.apply(a, dtype=np.dtype(dtype))


def where(cond, a, b):
    cond = np.asarray(cond.data if isinstance(cond, Tensor) else cond, dtype=bool)
    a, b = binary_operands("where", a, b) if isinstance(a, Tensor) else binary_operands("where", b, a)[::-1]
    try:
        np.broadcast_shapes(cond.shape, a.shape, b.shape)
    except ValueError:
        raise ValueError(f"where: condition {cond.shape} does not broadcast with {a.shape} and {b.shape}") from None
    return Where.apply(a, b, cond=cond)


def masked_fill(a, mask, value):
    """Positions where `mask` is True take `value`; the gradient flows only elsewhere."""
    return where(mask, as_tensor(value, a), a)
