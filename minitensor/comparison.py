"""Comparisons and logic: `< <= > >= == !=`, `& | ^ ~ << >>`, logical_*, isnan, isclose, ...

Each gives a bool tensor (or, for `allclose` and `equal`, one Python bool) and records
no graph: a comparison is a step function, its derivative zero almost everywhere, so
PyTorch gives its result no gradient and neither does minitensor. The operands are
promoted as in arithmetic (minitensor.promotion) and broadcast like numpy.
"""
import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function
from minitensor.errors import DTypeError
from minitensor.operands import binary_operands
from minitensor.tensor import Tensor


class Discrete(Function):
    """y = fn(inputs) with a bool or integer result: a comparison, a logical op, an argmax,
    a cast to an integer dtype. Its output never requires grad (Function.apply links no
    node for a non-float output), but it is an op: graph.trace records it."""

    def forward(self, *arrays, fn):
        return np.asarray(fn(*arrays))


def discrete(fn, *tensors):
    return Discrete.apply(*tensors, fn=fn)


def _compare(op, ufunc, a, b):
    return discrete(ufunc, *binary_operands(op, a, b))


def lt(a, b):
    return _compare("lt", np.less, a, b)


def le(a, b):
    return _compare("le", np.less_equal, a, b)


def gt(a, b):
    return _compare("gt", np.greater, a, b)


def ge(a, b):
    return _compare("ge", np.greater_equal, a, b)


def eq(a, b):
    return _compare("eq", np.equal, a, b)


def ne(a, b):
    return _compare("ne", np.not_equal, a, b)


def _bitwise(op, ufunc, *operands):
    """Bitwise ops are defined on bool and integer tensors only, as in PyTorch."""
    tensors = binary_operands(op, *operands) if len(operands) == 2 else operands
    if any(dtypes.is_floating(t.dtype) for t in tensors):
        raise DTypeError(f"{op}: needs bool or integer tensors, got dtypes {[str(t.dtype) for t in tensors]}")
    return discrete(ufunc, *tensors)


def bitwise_and(a, b):
    return _bitwise("bitwise_and", np.bitwise_and, a, b)


def bitwise_or(a, b):
    return _bitwise("bitwise_or", np.bitwise_or, a, b)


def bitwise_xor(a, b):
    return _bitwise("bitwise_xor", np.bitwise_xor, a, b)


def bitwise_left_shift(a, b):
    """a << b: a·2^b in the integer dtype (bits past the top are lost)."""
    return _bitwise("bitwise_left_shift", np.left_shift, a, b)


def bitwise_right_shift(a, b):
    """a >> b: floor(a / 2^b), arithmetic (a negative a stays negative)."""
    return _bitwise("bitwise_right_shift", np.right_shift, a, b)


def bitwise_not(a):
    """~a: logical not of a bool tensor, two's complement not of an integer one."""
    return _bitwise("bitwise_not", np.invert, a)


def logical_and(a, b):
    """Nonzero is True: a and b as truth values."""
    return discrete(np.logical_and, *binary_operands("logical_and", a, b))


def logical_or(a, b):
    return discrete(np.logical_or, *binary_operands("logical_or", a, b))


def logical_xor(a, b):
    return discrete(np.logical_xor, *binary_operands("logical_xor", a, b))


def logical_not(a):
    return discrete(np.logical_not, a)


def isnan(a):
    return discrete(np.isnan, unary_floating(a))


def isinf(a):
    return discrete(np.isinf, unary_floating(a))


def isfinite(a):
    return discrete(np.isfinite, unary_floating(a))


def unary_floating(a):
    """numpy's isnan has no integer loop: integers go in as floats (never NaN or inf)."""
    return a if dtypes.is_floating(a.dtype) else Tensor(a.data.astype(np.float64))


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|a − b| ≤ atol + rtol·|b| elementwise (not symmetric in a and b, as in PyTorch)."""
    a, b = binary_operands("isclose", a, b)
    return discrete(lambda x, y: np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan), a, b)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """One Python bool: isclose everywhere."""
    return bool(isclose(a, b, rtol, atol, equal_nan).data.all())


def equal(a, b):
    """One Python bool: the same shape and the same values."""
    return a.shape == b.shape and bool(np.array_equal(a.data, b.data))
