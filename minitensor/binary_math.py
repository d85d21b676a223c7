"""Elementwise binary math beyond arithmetic: division rounded to an integer (`div(a, b,
rounding_mode="trunc" | "floor")`, `floor_divide`), what it leaves over (`remainder`, the
`%` of Python, and `fmod`, C's), and `copysign`. Operands broadcast and promote as in
arithmetic (minitensor.operands).
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.errors import DivisionByZero
from minitensor.operands import binary_operands, floating, unbroadcast
from minitensor.tensor import Tensor

ROUNDING_MODES = ("trunc", "floor")


def _trunc_divide(a, b):
    """a / b rounded toward zero. Integers stay exact: the floor quotient, one up where the
    division left a remainder and the signs differ (numpy has no integer trunc division)."""
    if a.dtype.kind == "f":
        return np.trunc(a / b)
    q = np.floor_divide(a, b)
    return q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))


class RoundedDiv(Function):
    """y = trunc(a / b) or floor(a / b) (floor as Python's //, fmod-based for floats); a step
    function of a and b, so its gradient is 0 almost everywhere, as PyTorch gives it."""

    def forward(self, a, b, mode):
        self.shapes = a.shape, b.shape
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(_trunc_divide(a, b) if mode == "trunc" else np.floor_divide(a, b))

    def backward(self, grad):
        return tuple(np.zeros(shape, grad.dtype) for shape in self.shapes)


def rounded_div(a, b, rounding_mode):
    """`torch.div(a, b, rounding_mode=)`: 'trunc' rounds a / b toward zero, 'floor' down;
    integers stay integers (PyTorch's dtype), floats stay floats."""
    if rounding_mode not in ROUNDING_MODES:
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b = division_operands("div", a, b, f" (rounding_mode={rounding_mode!r})")
    return RoundedDiv.apply(a, b, mode=rounding_mode)


def division_operands(op, a, b, where=""):
    """The promoted operands of a rounded division or a remainder: bools divide as int64, and an
    integer division by zero is refused (numpy would give 0 with a warning)."""
    a, b = binary_operands(op, a, b)
    if a.dtype == np.bool_:
        a, b = Tensor(a.data.astype(np.int64)), Tensor(b.data.astype(np.int64))
    if a.dtype.kind in "iu" and (b.data == 0).any():
        raise DivisionByZero(f"{op}: integer division by zero{where}")
    return a, b


def floor_divide(a, b):
    """a // b: `div(a, b, rounding_mode='floor')`."""
    return rounded_div(a, b, "floor")


class Remainder(Function):
    """r = a − q·b with q = floor(a / b) ('floor': r has b's sign, Python's %) or trunc(a / b)
    ('trunc': r has a's sign, C's fmod). q is flat almost everywhere, so
    dr/da = 1 and dr/db = −q (PyTorch's gradients)."""

    def forward(self, a, b, mode):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.remainder(a, b) if mode == "floor" else np.fmod(a, b)
            self.quotient = _trunc_divide(a, b) if mode == "trunc" else np.floor_divide(a, b)
        self.shapes = a.shape, b.shape
        return np.asarray(r)

    def backward(self, grad):
        return unbroadcast(grad, self.shapes[0]), unbroadcast(-grad * self.quotient, self.shapes[1])


def _remainder(op, a, b, mode):
    return Remainder.apply(*division_operands(op, a, b), mode=mode)


def remainder(a, b):
    """a − floor(a / b)·b: the sign of b, as Python's `%` (`torch.remainder`, `a % b`)."""
    return _remainder("remainder", a, b, "floor")


def fmod(a, b):
    """a − trunc(a / b)·b: the sign of a, as C's fmod (`torch.fmod`)."""
    return _remainder("fmod", a, b, "trunc")


class Copysign(Function):
    """y = |a| with the sign of b (its sign bit: −0.0 counts as negative).
    da = dy · y / a (±1, 0 where a = 0, as PyTorch);  db = 0 (y is flat in b off b = 0)."""

    def forward(self, a, b):
        y = np.copysign(a, b)
        self.save_for_backward(a, y)
        self.b_shape = b.shape
        return y

    def backward(self, grad):
        a, y = self.saved
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(a == 0, np.zeros((), a.dtype), y / a)
        return unbroadcast(grad * ratio, a.shape), np.zeros(self.b_shape, grad.dtype)


def copysign(a, b):
    """|a| with b's sign, elementwise; integers compute in float32, as in PyTorch."""
    return Copysign.apply(*floating("copysign", *binary_operands("copysign", a, b)))
