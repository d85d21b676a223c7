"""Chapter 16, part 1: the online-softmax merge, small enough to check by hand.

    python tutorials/16_context_parallel/online_softmax.py

Prints: one query's scores against four keys split into two blocks of two; each block's
log-sum-exp L_b and output O_b; the merged L and O by the rule
L = log(e^L1 + e^L2), O = e^(L1−L)·O1 + e^(L2−L)·O2; the softmax over all four keys; their
difference. Then the same with scores a thousand times larger, where e^s overflows but
the merge (every exponent a difference ≤ 0) does not.
"""
import numpy as np

from parallel.context_parallel import block_attention, merge_partial

SCORES = np.array([[1.0, 2.0, 0.5, 3.0]])  # one query against four keys (already q·k/√d)
VALUES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])


def blocks(scores):
    """Each block of two keys as block_attention sees it: q = 1, k = the scores, so q·kᵀ = scores."""
    q = np.ones((1, 1))
    return [block_attention(q, scores[:, cols].T, VALUES[cols], 1.0, False) for cols in (slice(0, 2), slice(2, 4))]


def softmax_attention(scores):
    weights = np.exp(scores - scores.max())
    return weights / weights.sum() @ VALUES, np.log(np.exp(scores - scores.max()).sum()) + scores.max()


def show(scores):
    (o1, l1), (o2, l2) = blocks(scores)
    print(f"block 1 (keys 0, 1): L1 = log(e^{scores[0, 0]:g} + e^{scores[0, 1]:g}) = {l1[0]:.6f}, "
          f"O1 = {np.round(o1[0], 6)}")
    print(f"block 2 (keys 2, 3): L2 = log(e^{scores[0, 2]:g} + e^{scores[0, 3]:g}) = {l2[0]:.6f}, "
          f"O2 = {np.round(o2[0], 6)}")
    out, lse = o1.copy(), l1.copy()
    merge_partial(out, lse, o2, l2)
    print(f"merged: L = log(e^L1 + e^L2) = {lse[0]:.6f}; weights e^(L1-L) = {np.exp(l1 - lse)[0]:.6f}, "
          f"e^(L2-L) = {np.exp(l2 - lse)[0]:.6f}; O = {np.round(out[0], 6)}")
    full, full_lse = softmax_attention(scores)
    print(f"softmax over all four keys: L = {full_lse:.6f}, O = {np.round(full[0], 6)}")
    return max(np.abs(out - full).max(), abs(lse[0] - full_lse))


def main():
    print(f"one query, scores {SCORES[0].tolist()}, values {VALUES.tolist()}")
    print(f"merged vs full softmax, largest difference: {show(SCORES):.1e}")
    big = SCORES * 1000
    with np.errstate(over="ignore"):
        naive = np.exp(big).sum()
    print(f"\nscores x 1000: the naive sum of e^s is {naive} (overflow: {not np.isfinite(naive)})")
    print(f"merged vs full softmax at scores x 1000, largest difference: {show(big):.1e}")


if __name__ == "__main__":
    main()
