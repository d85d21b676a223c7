"""Making tensors, with PyTorch's names and arguments: zeros, ones, full, empty, eye,
arange, linspace, randn, rand, randint, and the `*_like` forms.

Sizes are given as `zeros(2, 3)` or `zeros((2, 3))`; floats default to float32;
random ones draw from this thread's seeded generator (`mt.manual_seed`), so a run
is reproducible.
"""
import numpy as np

from minitensor.promotion import wrapped_dtype
from minitensor.random import default_generator, normal
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


def full(size, fill_value, *, dtype=None, requires_grad=False):
    """A tensor of `size` filled with `fill_value`; the dtype follows the value (bool, int64,
    float32) unless given, as in PyTorch."""
    dtype = wrapped_dtype(fill_value) if dtype is None else _numeric_dtype("full", dtype)
    return Tensor(np.full(_shape("full", (size,) if np.ndim(size) == 0 else size), fill_value, dtype),
                  requires_grad=requires_grad)


def empty(*size, dtype=None, requires_grad=False):
    """PyTorch leaves the values unset; here they are zeros, so a run stays reproducible."""
    return zeros(*size, dtype=dtype, requires_grad=requires_grad)


def eye(n, m=None, *, dtype=None, requires_grad=False):
    """The n×m identity (m = n by default)."""
    return Tensor(np.eye(*_shape("eye", (n, n if m is None else m)), dtype=_numeric_dtype("eye", dtype)),
                  requires_grad=requires_grad)


def linspace(start, end, steps, *, dtype=None, requires_grad=False):
    """`steps` evenly spaced values from start to end, both included."""
    if steps < 0:
        raise ValueError(f"linspace: steps must be non-negative, got {steps}")
    return Tensor(np.linspace(start, end, steps).astype(_numeric_dtype("linspace", dtype)), requires_grad=requires_grad)


def rand(*size, dtype=None, requires_grad=False, generator=None):
    """Uniform values in [0, 1) from `generator` (default: this thread's seeded one)."""
    shape, dtype = _shape("rand", size), _numeric_dtype("rand", dtype)
    if dtype.kind != "f":
        raise TypeError(f"rand: dtype must be a float type, got {dtype}")
    rng = generator if generator is not None else default_generator()
    return Tensor(rng.random(shape).astype(dtype), requires_grad=requires_grad)


def randint(low=0, high=None, size=None, *, dtype=None, generator=None):
    """Integers uniform in [low, high), int64 by default: `randint(high, size)` or
    `randint(low, high, size)`, as in PyTorch."""
    if size is None:  # randint(high, size)
        low, high, size = 0, low, high
    if high is None or size is None:
        raise TypeError("randint: needs high and size, as randint(high, size) or randint(low, high, size)")
    if high <= low:
        raise ValueError(f"randint: needs low < high, got low={low}, high={high}")
    rng = generator if generator is not None else default_generator()
    dtype = np.dtype(np.int64) if dtype is None else _numeric_dtype("randint", dtype)
    return Tensor(rng.integers(low, high, size=_shape("randint", size)).astype(dtype))


def _like(maker, a, dtype, **kwargs):
    """`maker` for a tensor of `a`'s shape and (unless given) dtype."""
    return maker(a.shape, dtype=a.dtype if dtype is None else dtype, **kwargs)


def zeros_like(a, *, dtype=None, requires_grad=False):
    return _like(zeros, a, dtype, requires_grad=requires_grad)


def ones_like(a, *, dtype=None, requires_grad=False):
    return _like(ones, a, dtype, requires_grad=requires_grad)


def empty_like(a, *, dtype=None, requires_grad=False):
    return _like(empty, a, dtype, requires_grad=requires_grad)


def full_like(a, fill_value, *, dtype=None, requires_grad=False):
    return full(a.shape, fill_value, dtype=a.dtype if dtype is None else dtype, requires_grad=requires_grad)


def rand_like(a, *, dtype=None, requires_grad=False, generator=None):
    return _like(rand, a, dtype, requires_grad=requires_grad, generator=generator)


def randn_like(a, *, dtype=None, requires_grad=False, generator=None):
    return _like(randn, a, dtype, requires_grad=requires_grad, generator=generator)
