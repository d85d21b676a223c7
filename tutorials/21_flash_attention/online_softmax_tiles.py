"""One query against six keys in tiles of two: the running max m, sum ℓ and unnormalised output Õ
after each tile (the library's own online_softmax_step), then O = Õ/ℓ and L = m + log ℓ against
the softmax over all six keys at once.

    python tutorials/21_flash_attention/online_softmax_tiles.py
"""
import numpy as np

from minitensor.nn.flash_attention import online_softmax_step

SCORES = np.array([[1.0, 3.0, 0.5, 4.0, 2.0, -1.0]])  # s_j = q·k_j/√d of the one query
VALUES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0], [0.0, 2.0], [3.0, 3.0]])


def fold(scores, values, tile):
    """(m, ℓ, Õ) after each tile of `tile` keys, and the final (O, L)."""
    m, l, o = np.full(1, -np.inf), np.zeros(1), np.zeros((1, values.shape[1]))
    steps = []
    for start in range(0, scores.shape[1], tile):
        cols = slice(start, start + tile)
        online_softmax_step(m, l, o, scores[:, cols], values[cols])
        steps.append((cols, m.copy(), l.copy(), o.copy()))
    return steps, o / l[:, None], m + np.log(l)


def main():
    np.set_printoptions(precision=6, suppress=True)
    print(f"one query, scores {SCORES[0].tolist()}, tiles of 2 keys")
    steps, out, lse = fold(SCORES, VALUES, 2)
    for cols, m, l, o in steps:
        print(f"after keys {cols.start}-{cols.stop - 1}: m = {m[0]:.6f}, l = {l[0]:.6f}, unnormalised O = {o[0]}")
    weights = np.exp(SCORES - SCORES.max())
    weights /= weights.sum()
    full_out, full_lse = weights @ VALUES, np.log(np.exp(SCORES).sum())
    print(f"O = unnormalised O / l = {out[0]}, L = m + log l = {lse[0]:.6f}")
    print(f"softmax over all six keys: O = {full_out[0]}, L = {full_lse:.6f}")
    print(f"tiles vs all at once, largest difference: {max(np.abs(out - full_out).max(), abs(lse[0] - full_lse)):.1e}")
    huge = fold(SCORES * 1000, VALUES, 2)
    with np.errstate(over="ignore"):
        naive = bool(np.isinf(np.exp(SCORES * 1000)).any())
    print(f"scores x 1000: m = {huge[0][-1][1][0]:.1f}, O = {huge[1][0]} (the naive e^s is inf: {naive})")


if __name__ == "__main__":
    main()
