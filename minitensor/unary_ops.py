"""Differentiable elementwise functions of one tensor: exp, log, sqrt, tanh, relu, gelu.

These are the GPT's kernels; more elementwise math is in math_ops, more activations in
activations. An integer or bool input is computed in the default float dtype (float32).

Every elementwise op is written one way: a Function whose forward computes y from x and
saves what the derivative needs, and whose backward, beside it, returns dy · dy/dx.
"""
import math

import numpy as np

from minitensor import dtypes, speed
from minitensor.autograd import Function, is_grad_enabled
from minitensor.math_ops import erf_array
from minitensor.operands import as_floating


class Exp(Function):
    """y = eˣ;  dy/dx = eˣ = y."""

    def forward(self, x):
        y = np.exp(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * y


class Log(Function):
    """y = ln x;  dy/dx = 1/x."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.log(x)

    def backward(self, grad):
        (x,) = self.saved
        return grad / x


class Sqrt(Function):
    """y = √x;  dy/dx = 1/(2√x) = 1/(2y)."""

    def forward(self, x):
        y = np.sqrt(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad / (2 * y)


class Tanh(Function):
    """y = tanh x;  dy/dx = 1 − tanh²x = 1 − y²."""

    def forward(self, x):
        y = np.tanh(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * (1 - y**2)


class Relu(Function):
    """y = max(x, 0);  dy/dx = 1 for x > 0, else 0 (0 at 0, as PyTorch)."""

    def forward(self, x):
        positive = x > 0
        self.save_for_backward(positive)
        return x * positive

    def backward(self, grad):
        (positive,) = self.saved
        return grad * positive


class Gelu(Function):
    """GPT-2's tanh approximation: y = x·Φ(x) with Φ(x) ≈ ½(1 + tanh(u)), u = c(x + 0.044715x³).

    dy/dx = ½(1 + tanh u) + ½x(1 − tanh²u)·c(1 + 3·0.044715x²), with c = √(2/π).
    A fused kernel: a 16-bit input is computed in float32 and each result rounded once
    (a dozen 16-bit steps would round a dozen times, and numpy's float16 arithmetic is slow).
    """

    C = math.sqrt(2 / math.pi)

    def forward(self, x):
        dtype, (x,) = x.dtype, dtypes.upcast(x)
        y = np.empty_like(x)
        if not speed.enabled("gelu_saves_derivative"):  # the plain version: x and t, dy/dx in backward
            t = np.empty_like(x)
            self.save_for_backward(x, t)
            self.fill_forward(x, y, t, None)
        else:
            # Keep dy/dx (one array) instead of x and tanh u (two): backward only multiplies,
            # and the MLP's widest activation, x, is freed once the next Linear has read it.
            # Measured on the medium bench GPT (tracemalloc, with free_unsaved_activations on):
            # alive after forward 182 → 150 MiB (8 MiB a block), peak of the step 207 → 164 MiB.
            derivative = np.empty_like(x) if is_grad_enabled() else None
            if derivative is not None:
                self.save_for_backward(derivative)
            self.fill_forward(x, y, None, derivative)
        return dtypes.like(dtype, y)

    def fill_forward(self, x, y, t_out, derivative_out):
        """y = gelu(x) into `y`, keeping t = tanh u in `t_out` or dy/dx in `derivative_out`
        where given."""
        # u = c·x·(1 + 0.044715x²), built in one owned buffer (x*x, not x**3: numpy's
        # float32 power is ~100x slower than a product)
        u = np.multiply(x, x, out=y if t_out is None else t_out)  # t not kept: built in y's buffer
        u *= 0.044715
        u += 1
        u *= x
        u *= self.C
        t = np.tanh(u, out=u)
        if derivative_out is not None:
            self.derivative(x, t, out=derivative_out)
        np.add(t, 1, out=y)
        y *= x
        y *= 0.5

    def backward(self, grad):
        dtype, (grad,) = grad.dtype, dtypes.upcast(grad)
        dx = np.empty_like(grad)
        if len(self.saved) == 2:  # the plain version
            self.derivative(*self.saved, out=dx)
            dx *= grad
        else:
            np.multiply(self.saved[0], grad, out=dx)
        return dtypes.like(dtype, dx)

    def derivative(self, x, t, out):
        """dy/dx from x and t = tanh u, into `out`."""
        d = np.multiply(x, x, out=out)  # becomes x·du/dx·(1 − t²), then the whole bracket
        d *= 3 * 0.044715
        d += 1
        d *= self.C
        d *= x
        one_minus_t2 = np.multiply(t, t, out=np.empty_like(t))
        d *= np.subtract(1, one_minus_t2, out=one_minus_t2)  # 1 − t², in one buffer
        d += 1
        d += t
        d *= 0.5


class GeluErf(Function):
    """The exact GELU: y = x·Φ(x), Φ(x) = ½(1 + erf(x/√2));  dy/dx = Φ(x) + x·φ(x),
    φ(x) = e^(−x²/2)/√(2π)."""

    def forward(self, x):
        phi = (0.5 * (1 + erf_array(x / math.sqrt(2)))).astype(x.dtype, copy=False)
        self.save_for_backward(x, phi)
        return x * phi

    def backward(self, grad):
        x, phi = self.saved
        return grad * (phi + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))


def exp(a):
    return Exp.apply(as_floating(a))


def log(a):
    return Log.apply(as_floating(a))


def sqrt(a):
    return Sqrt.apply(as_floating(a))


def tanh(a):
    return Tanh.apply(as_floating(a))


def relu(a):
    return Relu.apply(a)


def gelu(x, approximate="none"):
    """GELU: approximate='none' (the default, as PyTorch's) is the exact x·Φ(x), 'tanh' GPT-2's
    approximation, the GPT's fused kernel (Gelu), which the models ask for by name."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return (Gelu if approximate == "tanh" else GeluErf).apply(as_floating(x))
