"""Elementwise math of one tensor: abs, sign, rounding, trig and inverse trig, exp2/log2/
log10, log1p/expm1, rsqrt, reciprocal, square, erf.

Each op is a Function as in unary_ops: forward saves x or y, whichever dy/dx is quicker from;
backward returns dy · dy/dx. Rounding and sign are step functions: their derivative is 0
wherever it exists, and PyTorch returns 0 there.

Integer and bool inputs are computed in the default float dtype (float32), as in PyTorch,
except by abs, sign and the rounding ops, which keep an integer dtype.
"""
import math

import numpy as np

from minitensor.autograd import Function
from minitensor.operands import as_floating, as_tensor


class Abs(Function):
    """y = |x|;  dy/dx = sign x (0 at 0)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.abs(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * np.sign(x)


class Stepwise(Function):
    """A piecewise-constant f (sign, floor, ceil, round, trunc): dy/dx = 0."""

    def forward(self, x, fn):
        return fn(x)

    def backward(self, grad):
        return np.zeros_like(grad)


class Sin(Function):
    """y = sin x;  dy/dx = cos x."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.sin(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * np.cos(x)


class Cos(Function):
    """y = cos x;  dy/dx = −sin x."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.cos(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * -np.sin(x)


class Tan(Function):
    """y = tan x;  dy/dx = 1 + tan²x = 1 + y²."""

    def forward(self, x):
        y = np.tan(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * (1 + y * y)


class Asin(Function):
    """y = arcsin x;  dy/dx = 1/√(1 − x²)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.arcsin(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad / np.sqrt(1 - x * x)


class Acos(Function):
    """y = arccos x;  dy/dx = −1/√(1 − x²)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.arccos(x)

    def backward(self, grad):
        (x,) = self.saved
        return -grad / np.sqrt(1 - x * x)


class Atan(Function):
    """y = arctan x;  dy/dx = 1/(1 + x²)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.arctan(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad / (1 + x * x)


class Sinh(Function):
    """y = sinh x;  dy/dx = cosh x."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.sinh(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * np.cosh(x)


class Cosh(Function):
    """y = cosh x;  dy/dx = sinh x."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.cosh(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * np.sinh(x)


class Exp2(Function):
    """y = 2ˣ;  dy/dx = y·ln 2."""

    def forward(self, x):
        y = np.exp2(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * y * math.log(2)


class Log2(Function):
    """y = log₂ x;  dy/dx = 1/(x·ln 2)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.log2(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad / (x * math.log(2))


class Log10(Function):
    """y = log₁₀ x;  dy/dx = 1/(x·ln 10)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.log10(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad / (x * math.log(10))


class Log1p(Function):
    """y = ln(1 + x), exact for small x;  dy/dx = 1/(1 + x)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.log1p(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad / (1 + x)


class Expm1(Function):
    """y = eˣ − 1, exact for small x;  dy/dx = eˣ = y + 1."""

    def forward(self, x):
        y = np.expm1(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * (y + 1)


class Rsqrt(Function):
    """y = 1/√x;  dy/dx = −½·x^(−3/2) = −½·y³."""

    def forward(self, x):
        y = 1 / np.sqrt(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * (-0.5 * y * y * y)


class Reciprocal(Function):
    """y = 1/x;  dy/dx = −1/x² = −y²."""

    def forward(self, x):
        y = np.reciprocal(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * (-y * y)


class Square(Function):
    """y = x²;  dy/dx = 2x."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.square(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * (2 * x)


def erf_array(x):
    """erf of a numpy array: numpy has none, so Python's `math.erf` (exact to double
    precision) element by element, returned in x's dtype. Slow on big arrays."""
    return np.array(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)


class Erf(Function):
    """y = erf x = (2/√π) ∫₀ˣ e^(−t²) dt;  dy/dx = (2/√π)·e^(−x²)."""

    def forward(self, x):
        self.save_for_backward(x)
        return erf_array(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad * (2 / math.sqrt(math.pi) * np.exp(-x * x))


def abs(a):
    return Abs.apply(a)


def sign(a):
    return Stepwise.apply(a, fn=np.sign)


def floor(a):
    return Stepwise.apply(a, fn=np.floor)


def ceil(a):
    return Stepwise.apply(a, fn=np.ceil)


def trunc(a):
    return Stepwise.apply(a, fn=np.trunc)


def round(a, decimals=0):
    """Round half to even (0.5 → 0, 1.5 → 2), as PyTorch and numpy do."""
    return Stepwise.apply(a, fn=lambda x: np.round(x, decimals))


def _pointwise(cls):
    """The function `sin(a)` of the Function `Sin`: `a` computed in floats."""

    def op(a):
        return cls.apply(as_floating(a))
    op.__name__, op.__doc__ = cls.__name__.lower(), cls.__doc__
    return op


sin, cos, tan = _pointwise(Sin), _pointwise(Cos), _pointwise(Tan)
asin, acos, atan = _pointwise(Asin), _pointwise(Acos), _pointwise(Atan)
sinh, cosh = _pointwise(Sinh), _pointwise(Cosh)
exp2, log2, log10 = _pointwise(Exp2), _pointwise(Log2), _pointwise(Log10)
log1p, expm1 = _pointwise(Log1p), _pointwise(Expm1)
rsqrt, reciprocal, erf = _pointwise(Rsqrt), _pointwise(Reciprocal), _pointwise(Erf)


def square(a):
    """a², keeping an integer dtype as PyTorch does."""
    return Square.apply(as_tensor(a))
