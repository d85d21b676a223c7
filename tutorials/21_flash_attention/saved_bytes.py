"""Bytes kept for backward by causal attention on one head of size 64 in float32, dense vs flash,
at T = 256 ... 4096, counted by the engine itself (minitensor.graph.totals: every array a node
of the graph saved), with the formulas: dense keeps the T × T probabilities besides q, kᵀ and v;
flash keeps Q, K, V, O (T·d each) and L (T).

    python tutorials/21_flash_attention/saved_bytes.py [--lengths 256 512 ...]
"""
import argparse

import numpy as np

import minitensor as mt
from minitensor import graph
from minitensor.nn import functional as F
from minitensor.nn.flash_attention import flash_attention

D, BLOCK = 64, 128
LENGTHS = [256, 512, 1024, 2048, 4096]


def saved(kernel, t):
    rng = np.random.default_rng(0)
    q, k, v = (mt.tensor(rng.standard_normal((1, 1, t, D)).astype(np.float32), requires_grad=True) for _ in range(3))
    out = (flash_attention(q, k, v, causal=True, block_q=BLOCK, block_k=BLOCK) if kernel == "flash"
           else F.scaled_dot_product_attention(q, k, v, causal=True))
    return graph.totals(out)["saved_bytes"]


def table(lengths):
    """[(T, dense bytes, flash bytes)] by the engine's count."""
    return [(t, saved("dense", t), saved("flash", t)) for t in lengths]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    args = parser.parse_args()
    print(f"causal attention, one head, d = {D}, float32; flash in {BLOCK}x{BLOCK} tiles; bytes saved for backward")
    print(f"{'T':>6} {'dense bytes':>14} {'flash bytes':>12} {'dense/flash':>11} {'dense formula':>14} "
          f"{'flash formula':>14}")
    for t, dense, flash in table(args.lengths):
        print(f"{t:>6} {dense:>14,} {flash:>12,} {dense / flash:10.1f}x {4 * (t * t + 3 * t * D):>14,} "
              f"{4 * (4 * t * D + t):>14,}")


if __name__ == "__main__":
    main()
