"""Differentiable elementwise functions of one tensor: exp, log, sqrt, tanh, relu, gelu."""
import math

import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function


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
    A fused kernel: a 16-bit input is computed in float32 and each result rounded once
    (a dozen 16-bit steps would round a dozen times, and numpy's float16 arithmetic is slow).
    """

    C = math.sqrt(2 / math.pi)

    def forward(self, x):
        dtype, (x,) = x.dtype, dtypes.upcast(x)
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
        return dtypes.like(dtype, y)

    def backward(self, grad):
        x, t = self.saved
        dtype, (grad,) = grad.dtype, dtypes.upcast(grad)
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
        return dtypes.like(dtype, d)


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
