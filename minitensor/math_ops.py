"""Elementwise math of one tensor: abs, sign, rounding, trig and inverse trig, exp2/log2/
log10, log1p/expm1, rsqrt, reciprocal, square, erf.

Each op is a `Pointwise` Function given by two lines: y = f(x) and dy/dx as a function of
x and y (the chain rule then multiplies by the incoming gradient). Rounding and sign are
step functions: their derivative is 0 wherever it exists, and PyTorch returns 0 there.

Integer and bool inputs are computed in the default float dtype (float32), as in PyTorch,
except by abs, sign and the rounding ops, which keep an integer dtype.
"""
import math

import numpy as np

from minitensor.autograd import Function
from minitensor.operands import as_floating, as_tensor


class Pointwise(Function):
    """y = f(x); dx = dy · df(x, y). Subclasses set `f` (a numpy ufunc) and `df`."""

    def forward(self, x):
        y = self.f(x)
        self.save_for_backward(x, y)
        return y

    def backward(self, grad):
        x, y = self.saved
        return (grad * self.df(x, y)).astype(grad.dtype, copy=False)


class Abs(Pointwise):
    """y = |x|;  dy/dx = sign x (0 at 0)."""
    f, df = np.abs, staticmethod(lambda x, y: np.sign(x))


class Stepwise(Function):
    """A piecewise-constant f (sign, floor, ceil, round, trunc): dy/dx = 0."""

    def forward(self, x, fn):
        return fn(x)

    def backward(self, grad):
        return np.zeros_like(grad)


class Sin(Pointwise):
    """y = sin x;  dy/dx = cos x."""
    f, df = np.sin, staticmethod(lambda x, y: np.cos(x))


class Cos(Pointwise):
    """y = cos x;  dy/dx = −sin x."""
    f, df = np.cos, staticmethod(lambda x, y: -np.sin(x))


class Tan(Pointwise):
    """y = tan x;  dy/dx = 1 + tan²x = 1 + y²."""
    f, df = np.tan, staticmethod(lambda x, y: 1 + y * y)


class Asin(Pointwise):
    """y = arcsin x;  dy/dx = 1/√(1 − x²)."""
    f, df = np.arcsin, staticmethod(lambda x, y: 1 / np.sqrt(1 - x * x))


class Acos(Pointwise):
    """y = arccos x;  dy/dx = −1/√(1 − x²)."""
    f, df = np.arccos, staticmethod(lambda x, y: -1 / np.sqrt(1 - x * x))


class Atan(Pointwise):
    """y = arctan x;  dy/dx = 1/(1 + x²)."""
    f, df = np.arctan, staticmethod(lambda x, y: 1 / (1 + x * x))


class Sinh(Pointwise):
    """y = sinh x;  dy/dx = cosh x."""
    f, df = np.sinh, staticmethod(lambda x, y: np.cosh(x))


class Cosh(Pointwise):
    """y = cosh x;  dy/dx = sinh x."""
    f, df = np.cosh, staticmethod(lambda x, y: np.sinh(x))


class Exp2(Pointwise):
    """y = 2ˣ;  dy/dx = y·ln 2."""
    f, df = np.exp2, staticmethod(lambda x, y: y * math.log(2))


class Log2(Pointwise):
    """y = log₂ x;  dy/dx = 1/(x·ln 2)."""
    f, df = np.log2, staticmethod(lambda x, y: 1 / (x * math.log(2)))


class Log10(Pointwise):
    """y = log₁₀ x;  dy/dx = 1/(x·ln 10)."""
    f, df = np.log10, staticmethod(lambda x, y: 1 / (x * math.log(10)))


class Log1p(Pointwise):
    """y = ln(1 + x), exact for small x;  dy/dx = 1/(1 + x)."""
    f, df = np.log1p, staticmethod(lambda x, y: 1 / (1 + x))


class Expm1(Pointwise):
    """y = eˣ − 1, exact for small x;  dy/dx = eˣ = y + 1."""
    f, df = np.expm1, staticmethod(lambda x, y: y + 1)


class Rsqrt(Pointwise):
    """y = 1/√x;  dy/dx = −½·x^(−3/2) = −½·y³."""
    f, df = staticmethod(lambda x: 1 / np.sqrt(x)), staticmethod(lambda x, y: -0.5 * y * y * y)


class Reciprocal(Pointwise):
    """y = 1/x;  dy/dx = −1/x² = −y²."""
    f, df = np.reciprocal, staticmethod(lambda x, y: -y * y)


class Square(Pointwise):
    """y = x²;  dy/dx = 2x."""
    f, df = np.square, staticmethod(lambda x, y: 2 * x)


def erf_array(x):
    """erf of a numpy array: numpy has none, so Python's `math.erf` (exact to double
    precision) element by element, returned in x's dtype. Slow on big arrays."""
    return np.array(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)


class Erf(Pointwise):
    """y = erf x = (2/√π) ∫₀ˣ e^(−t²) dt;  dy/dx = (2/√π)·e^(−x²)."""
    f, df = staticmethod(erf_array), staticmethod(lambda x, y: 2 / math.sqrt(math.pi) * np.exp(-x * x))


def abs(a):
    return Abs.apply(a)


def _step(fn, a):
    return Stepwise.apply(a, fn=fn)


def sign(a):
    return _step(np.sign, a)


def floor(a):
    return _step(np.floor, a)


def ceil(a):
    return _step(np.ceil, a)


def trunc(a):
    return _step(np.trunc, a)


def round(a, decimals=0):
    """Round half to even (0.5 → 0, 1.5 → 2), as PyTorch and numpy do."""
    return _step(lambda x: np.round(x, decimals), a)


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
