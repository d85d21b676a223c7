"""Chapter 23, part 2: why DeepSeek-V3 promotes the FP8 partial sums every 128 elements.

    python tutorials/23_fp8/accumulation.py

A MODEL of the hardware, not the hardware (minitensor.fp8.gemm.limited_matmul): the products
of FP8 numbers are added into an accumulator cut to 14 significant bits after every addition
(DeepSeek-V3 §3.3.2 reports about that for H800 tensor cores). Without promotion the whole
K-long dot product stays in it; with promotion, every N_C = 128 products the partial sum is
added into float32. Positive operands (the worst case: nothing cancels) of a 4 × 4 output.
"""
import numpy as np

from minitensor.fp8.formats import E4M3, saturate
from minitensor.fp8.gemm import limited_matmul

KS = (128, 512, 1024, 2048, 4096)


def errors(ks=KS, bits=14, seed=0):
    """[(K, relative error without promotion, with promotion every 128)]."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        a = saturate(rng.uniform(0, 1, (4, k)), E4M3).astype(np.float32)
        b = saturate(rng.uniform(0, 1, (4, k)), E4M3).astype(np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64).T
        rel = [float(np.abs(limited_matmul(a, b, bits, every) - exact).max() / exact.max()) for every in (None, 128)]
        rows.append((k, *rel))
    return rows


def main():
    print("accumulator model: 14 significant bits, rounded toward zero after each addition")
    for k, plain, promoted in errors():
        print(f"K = {k:5d}: relative error without promotion {plain:.2e}, promoted every 128 {promoted:.2e}")


if __name__ == "__main__":
    main()
