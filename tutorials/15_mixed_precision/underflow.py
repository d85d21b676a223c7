"""Chapter 15, part 1: what float16 loses, and the two fixes (loss scaling, master weights).

    python tutorials/15_mixed_precision/underflow.py

Prints: float16's and bfloat16's range and spacing; a GPT's gradients in float16 against
float64, how many flush to zero without loss scaling and with it, and that scaling by a
power of two and unscaling gives the same bits; then a weight that float16 cannot move
by small updates, and its float32 master that can.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import minitensor as mt
from minitensor import dtypes
from minitensor.amp import MixedPrecision, precision_policy
from minitensor.models.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=32)
LOSS_WEIGHT = 1e-4  # a small loss (a late-training loss, or one term of many): small gradients


def formats():
    f16 = np.finfo(np.float16)
    print(f"float16: largest {float(f16.max):g}, smallest normal {float(f16.tiny):.3g}, smallest subnormal "
          f"{float(f16.smallest_subnormal):.3g}, spacing at 1: {float(f16.eps):.3g}")
    if dtypes.bfloat16 is not None:
        import ml_dtypes
        bf = ml_dtypes.finfo(dtypes.bfloat16)
        print(f"bfloat16: largest {float(bf.max):.3g}, smallest normal {float(bf.tiny):.3g}, "
              f"spacing at 1: {float(bf.eps):.3g}")


def gradients(dtype, scale, idx, targets):
    """The GPT's gradients (float64 copies, unscaled) with the loss scaled by `scale`."""
    mt.manual_seed(0)
    model = GPT(CONFIG)
    if dtype == np.float64:
        model.double()
        _, loss = model(idx, targets)
        (loss * LOSS_WEIGHT).backward()
        return [p.grad for p in model.parameters()]
    amp = MixedPrecision(model.parameters(), precision_policy("fp16"))
    amp.scaler.scale = scale
    _, loss = model(idx, targets)
    amp.backward(loss * LOSS_WEIGHT)
    return [p.grad.astype(np.float64) / scale for p in model.parameters()]


def underflow():
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 11, (8, 8)), rng.integers(0, 11, (8, 8))
    exact = gradients(np.float64, 1.0, idx, targets)
    total = sum(g.size for g in exact)
    largest = max(float(np.abs(e).max()) for e in exact)
    # Gradients that are 0 in exact arithmetic (attention's key bias: softmax ignores a shift shared by
    # all keys) come out as round-off noise, ~1e-20, whose bits differ with the CPU's BLAS kernel: they
    # are left out of the counts, which then say the same on every machine.
    real = [np.abs(e) > 1e-12 * largest for e in exact]
    tiny = sum(int(((np.abs(e) < 2.0**-24) & r).sum()) for e, r in zip(exact, real))
    print(f"\nGPT gradients of loss x {LOSS_WEIGHT:g}: {total:,} numbers; in float64 {tiny:,} are below float16's "
          f"smallest subnormal (2^-24)")
    for scale in (1.0, 2.0**8, 2.0**16):
        grads = gradients(np.float16, scale, idx, targets)
        zeros = sum(int(((g == 0) & r).sum()) for g, r in zip(grads, real))
        error = np.median([float(np.abs(g - e).max()) / largest for g, e in zip(grads, exact)])
        print(f"float16, loss scale {scale:>7g}: flushed to zero {zeros:>6,} of {total:,}; median over tensors of "
              f"the largest error, relative to the largest gradient: {error:.2e}")
    mt.manual_seed(0)
    model = GPT(CONFIG).double()
    _, loss = model(idx, targets)
    (loss * LOSS_WEIGHT * 2.0**16).backward()
    diff = max(float(np.abs(p.grad / 2.0**16 - e).max()) for p, e in zip(model.parameters(), exact))
    print(f"float64, scale 2^16 then unscale vs no scaling, largest difference: {diff:g}")


def master_weights():
    steps, update = 1000, 1e-4
    w16, w32 = np.float16(1.0), np.float32(1.0)
    for _ in range(steps):
        w16 = np.float16(w16 - np.float16(update))
        w32 = np.float32(w32 - np.float32(update))
    print(f"\n{steps} updates of -{update:g} to a weight of 1.0: float16 weight {float(w16):.4f}, "
          f"float32 master {float(w32):.4f} (exact {1 - steps * update:.4f}), its float16 copy "
          f"{float(np.float16(w32)):.4f}")
    print(f"why: float16's spacing just below 1.0 is {2.0**-11:.3g}; an update smaller than half of it rounds away")


if __name__ == "__main__":
    formats()
    underflow()
    master_weights()
