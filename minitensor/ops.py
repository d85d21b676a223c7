"""Differentiable elementwise, matmul and reduction ops, each forward beside its backward.

Binary ops broadcast like numpy; their backward sums the gradient back to each
input's shape in one helper, `unbroadcast`.
"""
import math

import numpy as np

from minitensor.autograd import Function
from minitensor.tensor import Tensor


def unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added or stretched, back to `shape`."""
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    stretched = tuple(leading + i for i, n in enumerate(shape) if n == 1 and grad.shape[leading + i] != 1)
    return grad.sum(axis=tuple(range(leading)) + stretched).reshape(shape)


def as_tensor(value, like):
    """Wrap a Python scalar or array so it can meet `like` in an op, without upcasting.

    A Python number takes the tensor's dtype (so float32 stays float32); integer arrays
    meeting a float tensor are cast to it.
    """
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value)
    if np.issubdtype(like.dtype, np.floating) and (array.ndim == 0 or not np.issubdtype(array.dtype, np.floating)):
        array = array.astype(like.dtype)
    return Tensor(array)


def binary_operands(op, a, b):
    """Coerce both operands to tensors and check dtypes and broadcasting, naming the op."""
    a = as_tensor(a, b) if not isinstance(a, Tensor) else a
    b = as_tensor(b, a)
    floats = [np.issubdtype(t.dtype, np.floating) for t in (a, b)]
    if all(floats) and a.dtype != b.dtype:
        raise TypeError(f"{op}: dtypes {a.dtype} and {b.dtype} differ; convert one explicitly")
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
            return (a.reshape(-1, a.shape[-1]) @ b).reshape(*a.shape[:-1], b.shape[-1])
        return a @ b

    def backward(self, grad):
        a, b = self.saved
        if b.ndim == 2:  # dA = dY Bᵀ; dB = Aᵀ dY, both as single GEMMs over all rows
            a2, g2 = a.reshape(-1, a.shape[-1]), grad.reshape(-1, grad.shape[-1])
            return (g2 @ b.T).reshape(a.shape), a2.T @ g2
        grad_a = grad @ np.swapaxes(b, -1, -2)
        grad_b = np.swapaxes(a, -1, -2) @ grad
        return unbroadcast(grad_a, a.shape), unbroadcast(grad_b, b.shape)


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
        count = self.winners.sum(axis=self.axes, keepdims=True)
        return self.winners * (grad / count)


class Exp(Function):
    def forward(self, a):
        self.out = np.exp(a)
        return self.out

    def backward(self, grad):
        return grad * self.out


class Log(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return np.log(a)

    def backward(self, grad):
        return grad / self.saved[0]


class Sqrt(Function):
    def forward(self, a):
        self.out = np.sqrt(a)
        return self.out

    def backward(self, grad):
        return grad / (2 * self.out)


class Tanh(Function):
    def forward(self, a):
        self.out = np.tanh(a)
        return self.out

    def backward(self, grad):
        return grad * (1 - self.out**2)


class Relu(Function):
    def forward(self, a):
        self.positive = a > 0
        return a * self.positive

    def backward(self, grad):
        return grad * self.positive


class Gelu(Function):
    """GPT-2's tanh approximation: y = x·Φ(x) with Φ(x) ≈ ½(1 + tanh(u)), u = c(x + 0.044715x³).

    dy/dx = ½(1 + tanh u) + ½x(1 − tanh²u)·c(1 + 3·0.044715x²), with c = √(2/π).
    """

    C = math.sqrt(2 / math.pi)

    def forward(self, x):
        # u = c·x·(1 + 0.044715x²), built in one owned buffer (x*x, not x**3: numpy's
        # float32 power is ~100x slower than a product)
        u = np.multiply(x, x, out=np.empty_like(x))  # an array even for 0-d x (x * x would be a scalar)
        u *= 0.044715
        u += 1
        u *= x
        u *= self.C
        t = np.tanh(u, out=u)
        self.save_for_backward(x, t)
        y = t + 1
        y *= x
        y *= 0.5
        return y

    def backward(self, grad):
        x, t = self.saved
        d = x * x  # becomes x·du/dx·(1 − t²), then the whole bracket
        d *= 3 * 0.044715
        d += 1
        d *= self.C
        d *= x
        d *= 1 - t * t
        d += 1
        d += t
        d *= 0.5
        d *= grad
        return d


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
        raise TypeError(f"matmul: dtypes {a.dtype} and {b.dtype} differ; convert one explicitly")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dims of {a.shape} and {b.shape} cannot be broadcast") from None
    return MatMul.apply(a, b)


def sum(a, axis=None, keepdims=False):
    return Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(a, axis=None, keepdims=False):
    count = math.prod(a.shape[i] for i in _normalize_axis(axis, a.ndim))
    return Sum.apply(a, axis=axis, keepdims=keepdims) * (1.0 / count)


def max(a, axis=None, keepdims=False):
    return Max.apply(a, axis=axis, keepdims=keepdims)


def exp(a):
    return Exp.apply(a)


def log(a):
    return Log.apply(a)


def sqrt(a):
    return Sqrt.apply(a)


def tanh(a):
    return Tanh.apply(a)


def relu(a):
    return Relu.apply(a)


def gelu(a):
    return Gelu.apply(a)


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
