"""Activations with PyTorch's names and arguments: sigmoid, logsigmoid, silu, leaky_relu,
elu, softplus, relu6, hardtanh, hardsigmoid, and the clamps: clamp/clip, maximum, minimum.

Each is a Function as in unary_ops, its derivative in the docstring; at a kink the
derivative is the one PyTorch returns (stated per op). relu, tanh and gelu (exact or
tanh-approximated), the GPT's kernels, live in unary_ops.
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.operands import as_floating, binary_operands, unbroadcast
from minitensor.tensor import Tensor


def _sigmoid(x):
    """1/(1 + e⁻ˣ) without overflow: e^(−|x|) ≤ 1 on both branches."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z))


class Sigmoid(Function):
    """y = σ(x) = 1/(1 + e⁻ˣ);  dy/dx = y(1 − y)."""

    def forward(self, x):
        y = _sigmoid(x)
        self.save_for_backward(y)
        return y

    def backward(self, grad):
        (y,) = self.saved
        return grad * y * (1 - y)


class LogSigmoid(Function):
    """y = log σ(x) = min(x, 0) − log(1 + e^(−|x|));  dy/dx = 1 − σ(x) = σ(−x)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))

    def backward(self, grad):
        (x,) = self.saved
        return grad * _sigmoid(-x)


class Silu(Function):
    """y = x·σ(x) (swish);  dy/dx = σ(x)·(1 + x(1 − σ(x)))."""

    def forward(self, x):
        s = _sigmoid(x)
        self.save_for_backward(x, s)
        return x * s

    def backward(self, grad):
        x, s = self.saved
        return grad * s * (1 + x * (1 - s))


class LeakyRelu(Function):
    """y = x for x > 0, else s·x;  dy/dx = 1 for x > 0, else s (s at 0, as PyTorch)."""

    def forward(self, x, negative_slope):
        self.save_for_backward(x)
        self.negative_slope = negative_slope
        return np.where(x > 0, x, negative_slope * x).astype(x.dtype, copy=False)

    def backward(self, grad):
        (x,) = self.saved
        return (grad * np.where(x > 0, 1, self.negative_slope)).astype(grad.dtype, copy=False)


class Elu(Function):
    """y = x for x > 0, else α(eˣ − 1);  dy/dx = 1 for x > 0, else α·eˣ (α at 0)."""

    def forward(self, x, alpha):
        self.save_for_backward(x)
        self.alpha = alpha
        return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False)

    def backward(self, grad):
        (x,) = self.saved
        return (grad * np.where(x > 0, 1, self.alpha * np.exp(np.minimum(x, 0)))).astype(grad.dtype, copy=False)


class Softplus(Function):
    """y = log(1 + e^(βx))/β, and y = x where βx > threshold (where the two agree to float
    precision);  dy/dx = σ(βx), and 1 above the threshold."""

    def forward(self, x, beta, threshold):
        self.save_for_backward(x)
        self.beta, self.threshold = beta, threshold
        bx = np.minimum(x * beta, threshold)
        smooth = (np.maximum(bx, 0) + np.log1p(np.exp(-np.abs(bx)))) / beta
        return np.where(x * beta > threshold, x, smooth).astype(x.dtype, copy=False)

    def backward(self, grad):
        (x,) = self.saved
        slope = np.where(x * self.beta > self.threshold, 1, _sigmoid(x * self.beta))
        return (grad * slope).astype(grad.dtype, copy=False)


class Hardtanh(Function):
    """y = min(max(x, lo), hi);  dy/dx = 1 strictly inside (lo, hi), 0 outside and at the
    ends (PyTorch's hardtanh and relu6; clamp instead passes the gradient at the ends)."""

    def forward(self, x, lo, hi):
        self.save_for_backward((x > lo) & (x < hi))
        return np.clip(x, lo, hi)

    def backward(self, grad):
        (inside,) = self.saved
        return grad * inside


class Clamp(Function):
    """y = min(max(x, lo), hi) with number bounds (None: no bound);  dy/dx = 1 where
    lo ≤ x ≤ hi (ends included, as PyTorch's clamp), else 0."""

    def forward(self, x, lo, hi):
        inside = np.ones(x.shape, bool) if lo is None else x >= lo
        if hi is not None:
            inside &= x <= hi
        self.save_for_backward(inside)
        return np.clip(x, lo, hi).astype(x.dtype, copy=False)

    def backward(self, grad):
        (inside,) = self.saved
        return grad * inside


class Maximum(Function):
    """y = max(a, b) elementwise;  the gradient goes to the larger, half to each on a tie
    (PyTorch's rule)."""

    pick = staticmethod(np.maximum)

    def forward(self, a, b):
        self.save_for_backward(np.where(a == b, 0.5, self.pick(a, b) == a))
        self.shapes = a.shape, b.shape
        return self.pick(a, b)

    def backward(self, grad):
        (share_a,) = self.saved
        grad_a = grad * share_a.astype(grad.dtype)
        return unbroadcast(grad_a, self.shapes[0]), unbroadcast(grad - grad_a, self.shapes[1])


class Minimum(Maximum):
    """y = min(a, b) elementwise;  the gradient goes to the smaller, half to each on a tie."""

    pick = staticmethod(np.minimum)


def sigmoid(x):
    return Sigmoid.apply(as_floating(x))


def logsigmoid(x):
    return LogSigmoid.apply(as_floating(x))


def silu(x):
    return Silu.apply(as_floating(x))


def leaky_relu(x, negative_slope=0.01):
    return LeakyRelu.apply(as_floating(x), negative_slope=negative_slope)


def elu(x, alpha=1.0):
    return Elu.apply(as_floating(x), alpha=alpha)


def softplus(x, beta=1.0, threshold=20.0):
    return Softplus.apply(as_floating(x), beta=beta, threshold=threshold)


def hardtanh(x, min_val=-1.0, max_val=1.0):
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} is greater than max_val {max_val}")
    return Hardtanh.apply(as_floating(x), lo=min_val, hi=max_val)


def relu6(x):
    return hardtanh(x, 0.0, 6.0)


def hardsigmoid(x):
    """relu6(x + 3) / 6: 0 below −3, 1 above 3, linear between; dy/dx = 1/6 strictly inside
    (−3, 3), 0 elsewhere (PyTorch's choice at the kinks)."""
    return relu6(as_floating(x) + 3.0) / 6.0


def maximum(a, b):
    return Maximum.apply(*binary_operands("maximum", a, b))


def minimum(a, b):
    return Minimum.apply(*binary_operands("minimum", a, b))


def clamp(x, min=None, max=None):
    """x limited to [min, max]; bounds are numbers or tensors (then maximum/minimum), None
    for no bound. PyTorch's `clip` is the same op."""
    if min is None and max is None:
        raise ValueError("clamp: give at least one of min and max")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        x = x if min is None else maximum(x, min)
        return x if max is None else minimum(x, max)
    if not isinstance(x, Tensor):
        x = Tensor(x)
    dtype = binary_operands("clamp", x, min if max is None else max)[0].dtype
    return Clamp.apply(x if dtype == x.dtype else x.to(dtype), lo=min, hi=max)


clip = clamp
