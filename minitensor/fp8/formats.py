"""The two 8-bit float formats of FP8 training, and the casts into them.

    float8_e4m3fn  1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinity ("fn": finite);
                   S.1111.111 is NaN, so the largest value is 1.110·2⁸ = 448; the smallest
                   normal 2⁻⁶, the smallest subnormal 2⁻⁹. For weights and activations.
    float8_e5m2    1 sign, 5 exponent (bias 15), 2 mantissa bits: IEEE-like, with ±inf and NaN;
                   largest 1.11·2¹⁵ = 57344, smallest subnormal 2⁻¹⁶. Range for gradients.

Both round to nearest, ties to the even mantissa (the dtypes are ml_dtypes', the ones JAX uses).
Two casts, as PyTorch has them:

    cast(x, fmt)      x.to(torch.float8_*): a value past the largest one's rounding range
                      overflows (e4m3fn: |x| > 464 → NaN, as ±inf do; e5m2: |x| ≥ 61440 → ±inf).
    saturate(x, fmt)  clamp to ±max first, then cast: what every scaling recipe uses (torchao's
                      and Transformer Engine's quantizers, torch._scaled_mm's inputs). Finite or
                      infinite, |x| > max becomes ±max (±inf → ±max: a scale chosen from a stale
                      amax must not turn an outlier into NaN); NaN stays NaN (it is a bug upstream,
                      kept visible). −0 stays −0.
"""
import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fp8Format:
    """An FP8 format by its bit fields, and its numpy dtype (ml_dtypes)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    has_inf: bool  # e5m2 keeps IEEE's infinities; e4m3fn spends them on finite values
    max: float

    @property
    def dtype(self):
        return np.dtype(_ml_dtype(self.name))


E4M3 = Fp8Format("float8_e4m3fn", 4, 3, 7, False, 448.0)
E5M2 = Fp8Format("float8_e5m2", 5, 2, 15, True, 57344.0)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


@functools.cache
def _ml_dtype(name):
    import ml_dtypes  # imported on first use, as dtypes.bfloat16 is (0.6 s of CPU)

    return getattr(ml_dtypes, name)


def cast(x, fmt):
    """x (float32 or float64) rounded to `fmt`: PyTorch's plain cast, overflow as described above."""
    return np.asarray(x).astype(fmt.dtype)


def saturate(x, fmt):
    """x clamped to [−max, max] and rounded to `fmt` (NaN stays NaN)."""
    x = np.asarray(x)
    return np.clip(x, -fmt.max, fmt.max).astype(fmt.dtype)


def dequantize(q, dtype=np.float32):
    """FP8 values as `dtype`: exact (every FP8 value is a float32 value)."""
    return q.astype(dtype)
