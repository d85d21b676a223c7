"""AdamW's moments stored narrower than the master weights (DeepSeek-V3 §3.3.1: "we adopt the
BF16 data format instead of FP32 to track the first and second moments in the AdamW
optimizer"; Megatron-LM's --exp-avg-dtype / --exp-avg-sq-dtype bf16, Transformer Engine's
FusedAdam with bf16 states). Two moments of 2 bytes instead of 4: optimizer state beside
float32 masters goes from 12 to 8 bytes per parameter.

With the masters in dtype W (float32; float64 for the tests' exact reference) and the
moments stored in S (bfloat16), one step of every element is

    m_W = W(m),  v_W = W(v)                          read: widening is exact
    m_W ← β₁·m_W + (1 − β₁)·g,  v_W ← β₂·v_W + (1 − β₂)·g²
    p ← p·(1 − lr·λ) − lr·m̂_W/(√v̂_W + ε)            this step reads the unrounded m_W, v_W
    m ← rne_S(m_W),  v ← rne_S(v_W)                  stored: each rounded once, to nearest even

(ml_dtypes' cast rounds a float64 to bfloat16 directly, not through float32.) An element
depends on its own p, g, m, v only, so a shard (ZeRO) steps exactly as the whole does, and
with S = W nothing is rounded: the plain AdamW step. Each store errs by at most 2⁻⁸ of the
stored moment (bfloat16's 8 significant bits). v sums non-negative terms, so the next v̂ is off by
at most 2⁻⁸ of itself; m's error, β₁·2⁻⁸·|m_old|, is relative to the old moment: where a new
gradient nearly cancels β₁·m it can exceed the new m and flip its sign. Since |m̂|/√v̂ ≲ 1, the
update then errs by about 2⁻⁸·lr at most: a fraction of a full Adam step, not of the element's own.
"""
import contextlib

import numpy as np

from minitensor import dtypes

MOMENT_DTYPES = ("float64", "float32", "bfloat16")  # float16 would need a scale: v = g² of 1e-4 underflows


def moment_dtype_of(moment_dtype, param_dtype):
    """The dtype AdamW stores its moments in: `moment_dtype` (a name of MOMENT_DTYPES, or a
    dtype), or the parameters' own when None; never wider than the parameters."""
    if moment_dtype is None:
        return np.dtype(param_dtype)
    name = moment_dtype if isinstance(moment_dtype, str) else np.dtype(moment_dtype).name
    if name not in MOMENT_DTYPES:
        raise ValueError(f"moment_dtype={moment_dtype!r} is not one of {MOMENT_DTYPES} (or None: the parameters')")
    if name == "bfloat16" and dtypes.bfloat16 is None:
        raise ValueError("bfloat16 moments need the ml_dtypes package: pip install -e '.[bf16]'")
    dtype = np.dtype(dtypes.bfloat16 if name == "bfloat16" else name)
    if dtype.itemsize > np.dtype(param_dtype).itemsize:
        raise ValueError(f"moment_dtype={dtype} is wider than the parameters' {np.dtype(param_dtype)}: the update "
                         f"is computed in the parameters' dtype, so wider moments would hold nothing more")
    return dtype


@contextlib.contextmanager
def widened(dtype, *stored):
    """The `stored` arrays read as `dtype` (exact copies), for the block to update in place;
    after it, each is stored back into its own array, rounded to nearest even."""
    # exercise 23.3: bfloat16 moments: read widened, stored back rounded
    # hint: copy each stored array into `dtype` (astype: exact), yield the copies for the update to work on,
    # hint: then write each copy back into its own stored array (array[...] = copy: one rounding to nearest even).
    wide = [array.astype(dtype) for array in stored]
    yield wide
    for array, value in zip(stored, wide):
        array[...] = value
    # end exercise
