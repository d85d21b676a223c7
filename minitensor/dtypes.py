"""The floating dtypes, the two 16-bit ones among them, and where 16-bit math adds in float32.

    float16    numpy's IEEE half: 5 exponent bits, 10 mantissa bits (largest 65504, ε = 2⁻¹⁰;
               below 2⁻¹⁴ ≈ 6e-5 it is subnormal, below 2⁻²⁴ ≈ 6e-8 it is zero)
    bfloat16   the "brain float" of the `ml_dtypes` package (JAX's numpy dtypes): float32's
               8 exponent bits with 7 mantissa bits (ε = 2⁻⁷), so float32's range and no loss
               scaling needed. Optional: `pip install -e '.[bf16]'`; `bfloat16` is None without it.

A 16-bit tensor's elementwise ops run in 16 bits: numpy rounds each result to the dtype.
Three kinds of work add many terms, and there 16-bit arithmetic would lose the answer;
they add in float32 and round once at the end, as GPU kernels do (tensor cores multiply
16-bit inputs and accumulate in float32):

    matmul        a K-term dot product. The products of two 16-bit numbers are exact in
                  float32, so this is "16-bit inputs, float32 sums, one rounding", done by
                  float32 BLAS (numpy's own float16 matmul also adds in float32 but without
                  BLAS: 100x slower, measured 15 s per step of the default GPT).
    sums          reductions: a bias gradient, a broadcast's gradient, `Tensor.sum`, the
                  embedding gradient's scatter-add. In bfloat16, 1 + 256 = 256: a sum of
                  ones stops growing at 256 (numpy's bfloat16 sum does exactly that).
    fused kernels softmax, log-softmax, LayerNorm and cross-entropy work inside in float32
                  and return the input's dtype; the loss (a mean over tokens) is returned in
                  float32, so that multiplying it by a loss scale of 2¹⁶ cannot overflow.

For float32 and float64 `accumulate_dtype` is the dtype itself and nothing changes.
"""
import functools

import numpy as np

float16, float32, float64 = np.float16, np.float32, np.float64


def __getattr__(name):
    """`dtypes.bfloat16` (None without ml_dtypes), imported on first use: importing ml_dtypes
    costs 0.6 s of CPU, which every rank and script that never computes in bfloat16 (and
    every test process) would otherwise pay at start."""
    if name == "bfloat16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _bfloat16():
    try:
        from ml_dtypes import bfloat16
    except ImportError:  # the optional extra is missing: bfloat16 policies say how to install it
        return None
    return bfloat16


def is_sixteen_bit(dtype):
    """float16 or bfloat16. Told by name: no array can be bfloat16 before ml_dtypes is imported,
    so asking does not import it."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":  # numpy's own floats: float16 is the 2-byte one (asked thousands of times a step)
        return dtype.itemsize == 2
    return dtype.name == "bfloat16"


@functools.cache  # asked for every op's output: answered once per dtype
def is_floating(dtype):
    """numpy's floating dtypes and bfloat16 (which numpy files under 'void')."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or is_sixteen_bit(dtype)


@functools.cache  # asked for every matmul and sum: answered once per dtype
def accumulate_dtype(dtype):
    """The dtype sums of `dtype` values are taken in: float32 for a 16-bit dtype, else itself."""
    dtype = np.dtype(dtype)
    return np.dtype(float32) if is_sixteen_bit(dtype) else dtype


def matmul(a, b, out=None):
    """a @ b (numpy arrays), into `out` if given; 16-bit inputs are multiplied and added in
    float32, rounded once."""
    acc = accumulate_dtype(a.dtype)
    if acc == a.dtype:
        return np.matmul(a, b, out=out)
    result = (a.astype(acc) @ b.astype(acc)).astype(a.dtype)
    if out is None:
        return result
    out[...] = result
    return out


def sum(a, axis=None, keepdims=False):
    """np.sum(a, axis, keepdims=...) added in accumulate_dtype(a.dtype), returned in a's dtype."""
    acc = accumulate_dtype(a.dtype)
    if acc == a.dtype:
        return np.sum(a, axis=axis, keepdims=keepdims)
    return np.sum(a, axis=axis, keepdims=keepdims, dtype=acc).astype(a.dtype)


def upcast(*arrays):
    """The arrays in their accumulate dtype (the same arrays, not copies, for float32/64):
    what a fused kernel computes in before it rounds its results back with `like`."""
    return tuple(a.astype(accumulate_dtype(a.dtype), copy=False) for a in arrays)


def like(dtype, *arrays):
    """The arrays rounded to `dtype` (unchanged, not copied, when they already have it)."""
    out = tuple(a if a is None else np.asarray(a).astype(dtype, copy=False) for a in arrays)
    return out if len(out) > 1 else out[0]
