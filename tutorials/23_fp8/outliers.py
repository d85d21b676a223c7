"""Chapter 23, part 1: the two FP8 formats, their casts, and one tensor with an outlier
quantized per tensor and per tile.

    python tutorials/23_fp8/outliers.py

An activation-like tensor (256 tokens × 512 features, normal values) gets one outlier
10⁴× the largest of the rest (LLM activations have a few such channels). Per tensor, the one scale is set
by the outlier, so the other values land near or below e4m3's smallest subnormal: many
flush to zero. With DeepSeek-V3's 1×128 tiles, only the outlier's own tile pays.
"""
import numpy as np

from minitensor.fp8.formats import E4M3, E5M2, cast, saturate
from minitensor.fp8.gemm import scaled_matmul
from minitensor.fp8.scaling import block_operand, per_tensor, quantize_blocks, quantize_tiles, scale_from_amax


def formats():
    for fmt in (E4M3, E5M2):
        finfo = np.finfo(fmt.dtype)
        print(f"{fmt.name:<14} largest {fmt.max:>7g}, smallest normal {float(finfo.smallest_normal):.3g}, "
              f"smallest subnormal {float(finfo.smallest_subnormal):.3g}, eps {float(finfo.eps):g}")
    edges = np.array([448, 464, 480, 57344, 61440, np.inf, np.nan], np.float32)
    for fmt in (E4M3, E5M2):
        plain, sat = cast(edges, fmt).astype(np.float64), saturate(edges, fmt).astype(np.float64)
        print(f"{fmt.name:<14} x = {' '.join(f'{v:g}' for v in edges)}\n{'':<14} cast {' '.join(f'{v:g}' for v in plain)}"
              f"\n{'':<14} saturate {' '.join(f'{v:g}' for v in sat)}")


def outlier_tensor(seed=0, outlier=1e4):
    x = np.random.default_rng(seed).normal(size=(256, 512)).astype(np.float32)
    x[3, 200] = outlier * np.abs(x).max()
    return x


def quantization_report(x):
    """{"per tensor": ..., "per 1x128 tile": ...}: (fraction flushed to zero, median relative error)."""
    scale = float(scale_from_amax(np.abs(x).max(), E4M3))
    results = {}
    for name, q in (("per tensor", per_tensor(x, scale, E4M3)), ("per 1x128 tile", quantize_tiles(x, 128, E4M3))):
        back = q.dequantize(np.float64)
        nonzero = x != 0
        flushed = float(np.mean((back == 0) & nonzero))
        error = float(np.median(np.abs(back[nonzero] - x[nonzero]) / np.abs(x[nonzero])))
        results[name] = (flushed, error)
    return results


def main():
    formats()
    x = outlier_tensor()
    print(f"\nactivation 256 x 512, N(0, 1) with one outlier of {np.abs(x).max():.0f}:")
    for name, (flushed, error) in quantization_report(x).items():
        print(f"  e4m3 {name:<15}: flushed to zero {flushed:6.1%}, median relative error {error:.2e}")
    rng = np.random.default_rng(1)
    w = rng.normal(size=(64, 300))
    a, b = quantize_tiles(x[:, :300].astype(np.float64), 128, E4M3), block_operand(*quantize_blocks(w, 128, E4M3), 128)
    exact = a.dequantize(np.float64) @ b.dequantize(np.float64).T
    gap = np.abs(scaled_matmul(a, b, np.float64) - exact).max() / np.abs(exact).max()
    print(f"block-scaled GEMM (K = 300, tiles of 128) vs the dequantized float64 product: {gap:.1e}")


if __name__ == "__main__":
    main()
