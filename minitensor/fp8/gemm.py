"""Products of FP8 operands with their scales, and a model of the hardware's accumulator.

Scaled GEMM. A (M, K) and B (N, K), each quantized along K in tiles of t (scaling.py):
a value is q / s, with s constant over a tile. Within tile j the scales factor out:

    C[m, n] = Σ_j ( Σ_{k ∈ tile j} qa[m, k] · qb[n, k] ) / (sa[m, j] · sb[n, j])

so the inner sums run on the FP8 values (products of two FP8 numbers are exact in
float32: 4 × 4 significant bits) and each tile's partial sum is scaled and added in the
accumulation dtype (float32; float64 for an exact reference). Per-tensor scaling is the
case of one tile spanning K: one product, then one division by sa·sb.

Limited accumulation (a MODEL of the hardware, not the hardware). DeepSeek-V3 §3.3.2
reports that the FP8 products of H800 tensor cores are accumulated with about 14
significant bits, so a long dot product loses its small terms (about 2% error at
K = 4096). Their remedy: every N_C = 128 elements the tensor core's partial sum is
promoted, i.e. added into a float32 accumulator on the CUDA cores. `limited_matmul`
emulates that: the products are added one k at a time into an accumulator that is cut
to `bits` significant bits (rounded toward zero) after every addition, and every
`promote_every` elements (None: never) the partial sum goes into a float32 total.
"""
import numpy as np


def scaled_matmul(a, b, dtype):
    """a @ bᵀ for Quantized a (M, K) and b (N, K) with the same tiling along K, accumulated in
    `dtype`: each tile's FP8 product, divided by its scales, added up."""
    if a.q.shape[1] != b.q.shape[1] or a.tile != b.tile:
        raise ValueError(f"scaled_matmul: operands {a.q.shape} (tiles of {a.tile}) and {b.q.shape} "
                         f"(tiles of {b.tile}) do not contract over one K with one tiling")
    k, t = a.q.shape[1], a.tile
    out = np.zeros((a.q.shape[0], b.q.shape[0]), dtype)
    for j, start in enumerate(range(0, k, t)):
        part = a.q[:, start:start + t].astype(dtype) @ b.q[:, start:start + t].astype(dtype).T
        out += part / (a.scale[:, j:j + 1].astype(dtype) * b.scale[:, j].astype(dtype))
    return out


def truncate_bits(x, bits):
    """x with its significand cut to `bits` bits, rounding toward zero (float32 in and out)."""
    mantissa, exponent = np.frexp(x)
    return np.ldexp(np.trunc(mantissa * 2.0**bits) / 2.0**bits, exponent).astype(np.float32)


def limited_matmul(a, b, bits=14, promote_every=None):
    """a @ bᵀ (float32 arrays of FP8 values, (M, K) and (N, K)) through the accumulator model
    above: products added one k at a time at `bits` bits, promoted into float32 every
    `promote_every` elements of K (None: the whole K in the limited accumulator)."""
    k = a.shape[1]
    interval = promote_every or k
    total = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for start in range(0, k, interval):
        partial = np.zeros_like(total)
        for i in range(start, min(start + interval, k)):
            partial = truncate_bits(partial + np.outer(a[:, i], b[:, i]), bits)
        total += partial
    return total
