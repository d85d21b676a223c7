"""Making tensors, with PyTorch's names and arguments: zeros, ones, randn, arange.

Sizes are given as `zeros(2, 3)` or `zeros((2, 3))`; floats default to float32;
`randn` draws from this thread's seeded generator (`mt.manual_seed`), so a run
is reproducible.
"""
import numpy as np

from minitensor.random import normal
from minitensor.shape_ops import dims_from_args
from minitensor.tensor import DEFAULT_FLOAT, Tensor


def _shape(op, size):
    shape = dims_from_args(size)
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
        raise ValueError(f"{op}: sizes must be non-negative integers, got {shape}")
    return shape


def _numeric_dtype(op, dtype):
    dtype = np.dtype(DEFAULT_FLOAT if dtype is None else dtype)
    if dtype.kind not in "biuf":
        raise TypeError(f"{op}: dtype must be a number type such as mt.float32, got {dtype}")
    return dtype


def zeros(*size, dtype=None, requires_grad=False):
    return Tensor(np.zeros(_shape("zeros", size), _numeric_dtype("zeros", dtype)), requires_grad=requires_grad)


def ones(*size, dtype=None, requires_grad=False):
    return Tensor(np.ones(_shape("ones", size), _numeric_dtype("ones", dtype)), requires_grad=requires_grad)


def randn(*size, dtype=None, requires_grad=False, generator=None):
    """Standard-normal values from `generator` (default: this thread's, seeded by `mt.manual_seed`)."""
    shape, dtype = _shape("randn", size), _numeric_dtype("randn", dtype)
    if dtype.kind != "f":
        raise TypeError(f"randn: dtype must be a float type, got {dtype}")
    return Tensor(normal(shape, 1.0, dtype, generator), requires_grad=requires_grad)


def arange(start, end=None, step=1, *, dtype=None, requires_grad=False):
    """start, start+step, ... up to (not including) end; `arange(n)` is 0..n−1.

    Integers give int64 and any float gives float32, as in PyTorch.
    """
    start, end = (0, start) if end is None else (start, end)
    if step == 0:
        raise ValueError("arange: step must not be 0")
    values = np.arange(start, end, step)
    if dtype is None and values.dtype.kind == "f":
        dtype = DEFAULT_FLOAT
    dtype = values.dtype if dtype is None else _numeric_dtype("arange", dtype)
    return Tensor(values.astype(dtype), requires_grad=requires_grad)
