"""Operands: what an op does to its inputs before its Function runs, and to a gradient after.

An op takes tensors, numpy arrays and Python numbers alike. Before its Function runs, the
operands become tensors of the one dtype the op computes in (PyTorch's promotion,
minitensor.promotion), checked to broadcast; after a broadcasting op's backward, the
gradient is summed back to each input's shape (`unbroadcast`). Every op module reads
these helpers here, and this module imports no op module.
"""
import numpy as np

from minitensor import dtypes, promotion
from minitensor.errors import DTypeError, ShapeError
from minitensor.tensor import Tensor


def unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added or stretched, back to `shape`."""
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    stretched = tuple(leading + i for i, n in enumerate(shape) if n == 1 and grad.shape[leading + i] != 1)
    return dtypes.sum(grad, axis=tuple(range(leading)) + stretched).reshape(shape)


def _raw(value):
    """What promotion sees of an operand: a tensor's array, a numpy array, or a number."""
    if isinstance(value, Tensor):
        return value.data
    if isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        return value
    return Tensor(value).data  # a nested list: an array; not numbers (a string): a TypeError naming it


def as_tensor(value):
    """`value` as a tensor: a tensor itself, anything else (an array, a number, a list) wrapped."""
    return value if isinstance(value, Tensor) else Tensor(value)


def _in_dtype(value, raw, dtype):
    """`value` as a tensor of `dtype`; a tensor that requires grad is cast differentiably."""
    if isinstance(value, Tensor):
        return value.to(dtype)
    if isinstance(raw, int) and np.dtype(dtype).kind in "iu":  # wraps, as PyTorch: uint8 tensor & -1 is & 255
        return Tensor(np.asarray(raw).astype(dtype))
    return Tensor(np.asarray(raw, dtype=dtype))


def promoted(op, *operands):
    """The operands as tensors of the one dtype `op` computes in (minitensor.promotion)."""
    raw = [_raw(x) for x in operands]
    dtype = promotion.result_type(op, *raw)
    return tuple(_in_dtype(x, r, dtype) for x, r in zip(operands, raw))


def dtype_mismatch(op, *tensors):
    """The error for tensors of different dtypes: ops never convert between float dtypes on
    their own (a float32 model must stay float32), so the message says how to convert."""
    return DTypeError(f"{op}: dtypes {[str(t.dtype) for t in tensors]} differ; convert one explicitly: "
                     f"t.to(mt.float32) (or .float(), .double()) for a tensor, "
                     f"mt.tensor(array, dtype=mt.float32) for a numpy array")


def binary_operands(op, a, b):
    """Both operands as tensors of one dtype (PyTorch's promotion: an int tensor with 2.5 is
    float32, a float32 tensor with 2.5 stays float32), checked to broadcast, naming the op."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype == b.dtype):
        a, b = promoted(op, a, b)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"{op}: shapes {a.shape} and {b.shape} cannot be broadcast together") from None
    return a, b


def floating(op, *operands):
    """The operands promoted, then in the default float dtype if that is not floating: what
    ops defined only on floats (true division, exp, sin, ...) compute in, as in PyTorch."""
    tensors = promoted(op, *operands)
    if dtypes.is_floating(tensors[0].dtype):
        return tensors
    return tuple(Tensor(t.data.astype(promotion.DEFAULT_FLOAT)) for t in tensors)


def as_floating(a):
    """`a` as a tensor with a floating dtype: an integer or bool one (or a number) in
    float32, as PyTorch computes `torch.exp(torch.tensor(2))`."""
    a = as_tensor(a)
    return a if dtypes.is_floating(a.dtype) else Tensor(a.data.astype(promotion.DEFAULT_FLOAT))
