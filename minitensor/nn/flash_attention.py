"""Flash attention (FlashAttention-2, Dao 2023, Algorithms 1 and 2): softmax(s·Q Kᵀ) V in tiles,
exact, keeping O(T·d) bytes for backward instead of the (T × T) probabilities.

Forward (Alg. 1). Q is cut into tiles of B_r rows, K and V into tiles of B_c rows. For one Q
tile, walk the K/V tiles keeping per query row a running max m, a running sum ℓ and an
UNNORMALISED output Õ. With S = s·Q_i K_jᵀ of one tile pair:

    m' = max(m, rowmax S),   P = e^(S − m'),   ℓ' = e^(m − m')·ℓ + rowsum P,   Õ' = e^(m − m')·Õ + P V_j

(every earlier term was weighted by e^(−m); multiplying by e^(m − m') re-bases them on the new
max, so after the last tile Õ = Σ_j e^(s_j − m)·v_j and ℓ = Σ_j e^(s_j − m) over all keys).
Then O = Õ / ℓ and the log-sum-exp L = m + log ℓ, the only two things saved besides Q, K, V.

Backward (Alg. 2). P of a tile is recomputed from L alone, P = e^(S − L), and with
D = rowsum(dO ⊙ O) (= rowsum(dP ⊙ P) over ALL keys, since O = P V):

    dV_j += Pᵀ dO_i,   dP = dO_i V_jᵀ,   dS = P ⊙ (dP − D_i),   dQ_i += s·dS K_j,   dK_j += s·dSᵀ Q_i

Causal attention (top-left aligned: query i sees keys j ≤ i, as PyTorch's is_causal) never
computes a tile that lies wholly above the diagonal. A boolean `mask` (True = may attend,
broadcastable to (..., T_q, T_k)) hides keys, e.g. padding. A query row that sees no key
gets O = 0, L = −∞ and no gradient (a dense softmax gives NaN there).

Context parallelism's ring attention runs tiled_forward / tiled_backward on each block pair
and merges the blocks' outputs by their L (parallel/context_parallel/ring_attention.py).
"""
import math

import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function
from minitensor.tensor import Tensor


def tiles(n, size):
    """The slices [0, size), [size, 2·size), ... covering range(n); the last may be short."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def visible(rows, cols, causal):
    """Whether some query of `rows` may see some key of `cols`: under causal, not wholly above the diagonal."""
    return not causal or cols.start < rows.stop


def tile_scores(q, k, scale, causal, hidden, rows, cols):
    """S = s·Q_i K_jᵀ of one tile pair, −∞ where the key is hidden (after the query, or masked)."""
    s = q[..., rows, :] @ k[..., cols, :].swapaxes(-1, -2)
    s *= scale
    if causal and cols.stop - 1 > rows.start:  # the tile crosses the diagonal
        after = np.arange(cols.start, cols.stop)[None, :] > np.arange(rows.start, rows.stop)[:, None]
        np.copyto(s, -np.inf, where=after)
    if hidden is not None:
        np.copyto(s, -np.inf, where=hidden[..., rows, cols])
    return s


def online_softmax_step(m, l, o, s, v):
    """Fold one tile's scores s (..., B_r, B_c) and values v (..., B_c, d) into the running
    max m, sum l (..., B_r) and unnormalised output o (..., B_r, d), all in place."""
    # exercise 21.1: the online softmax update
    # hint: the new max is the larger of m and the tile's row max; everything summed so far was weighted
    # hint: by e^(−m): re-base l and o on the new max, then add this tile's e^(S − m') and e^(S − m')·V.
    # hint: Do not divide by l here (that happens once, after the last tile). A row whose keys are all hidden
    # hint: so far has max −∞: shift it by 0 instead, so no −∞ − (−∞) appears.
    m_new = np.maximum(m, s.max(axis=-1))
    shift = np.where(np.isneginf(m_new), 0.0, m_new)
    p = np.exp(s - shift[..., None])
    rescale = np.exp(m - shift)
    l *= rescale
    l += p.sum(axis=-1)
    o *= rescale[..., None]
    o += p @ v
    m[...] = m_new
    # end exercise


def tiled_forward(q, k, v, scale, causal=False, hidden=None, block_q=64, block_k=64):
    """(O, L) of attention over the last two axes, tile by tile (Alg. 1). hidden: bool,
    broadcast to (..., T_q, T_k), True where a key is masked; None for none."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)  # a row that sees no key stays 0
    lse = np.empty(q.shape[:-1], q.dtype)
    for rows in tiles(t_q, block_q):
        m = np.full(q.shape[:-2] + (rows.stop - rows.start,), -np.inf, q.dtype)
        l, o = np.zeros_like(m), np.zeros(m.shape + v.shape[-1:], q.dtype)
        for cols in tiles(t_k, block_k):
            if visible(rows, cols, causal):
                online_softmax_step(m, l, o, tile_scores(q, k, scale, causal, hidden, rows, cols), v[..., cols, :])
        np.divide(o, l[..., None], out=out[..., rows, :], where=l[..., None] > 0)
        with np.errstate(divide="ignore"):
            lse[..., rows] = m + np.log(l)
    return out, lse


def tiled_backward(q, k, v, dout, lse, delta, scale, causal=False, hidden=None, block_q=64, block_k=64):
    """(dQ, dK, dV) from the saved L and D = rowsum(dO ⊙ O), tile by tile (Alg. 2): for each
    K/V tile, the Q tiles that see it. Ring attention passes the whole sequence's L and D."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    base = np.where(np.isneginf(lse), np.inf, lse)[..., None]  # a row that sees no key: P = e^(−∞) = 0
    for cols in tiles(t_k, block_k):
        k_j, v_j = k[..., cols, :], v[..., cols, :]
        for rows in tiles(t_q, block_q):
            if not visible(rows, cols, causal):
                continue
            p = np.exp(tile_scores(q, k, scale, causal, hidden, rows, cols) - base[..., rows, :])
            dout_i = dout[..., rows, :]
            dv[..., cols, :] += p.swapaxes(-1, -2) @ dout_i
            # exercise 21.2: the softmax's backward through D
            # hint: dS = P ⊙ (dP − D) with dP = dO_i V_jᵀ; D (delta) is rowsum(dO ⊙ O) over the whole row of
            # hint: keys, given for these rows: a sum over this tile's keys alone is not it. Leave dS in ds.
            ds = dout_i @ v_j.swapaxes(-1, -2)
            ds -= delta[..., rows, None]
            ds *= p
            # end exercise
            dq[..., rows, :] += (ds @ k_j) * scale
            dk[..., cols, :] += (ds.swapaxes(-1, -2) @ q[..., rows, :]) * scale
    return dq, dk, dv


class FlashAttention(Function):
    """O = softmax(s·Q Kᵀ, hidden keys left out) V by tiles; saves Q, K, V, O and L only (a mask
    is the caller's input, held by reference like a parameter, not an activation). 16-bit inputs
    are computed in float32 and the results rounded once (minitensor.dtypes)."""

    def forward(self, q, k, v, scale, causal, hidden, block_q, block_k, lse_out=None):
        self.args = dict(scale=scale, causal=causal, hidden=hidden, block_q=block_q, block_k=block_k)
        q32, k32, v32 = dtypes.upcast(q, k, v)
        out, lse = tiled_forward(q32, k32, v32, **self.args)
        out = dtypes.like(q.dtype, out)
        self.save_for_backward(q, k, v, out, lse)
        if lse_out is not None:
            lse_out[...] = lse
        return out

    def backward(self, grad):
        q, k, v, out, lse = self.saved
        q, k, v, out, grad = dtypes.upcast(q, k, v, out, grad)
        delta = np.vecdot(grad, out)  # D = rowsum(dO ⊙ O)
        return dtypes.like(self.saved[0].dtype, *tiled_backward(q, k, v, grad, lse, delta, **self.args))


def check_flash_args(q, k, v, mask, block_q, block_k):
    """A one-line ValueError for block sizes < 1, q/k/v shapes that disagree, a mask of the wrong shape."""
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"flash_attention: {name} must be a positive integer, got {size!r}")
    if (q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim or q.shape[-1] != k.shape[-1]
            or k.shape[:-1] != v.shape[:-1] or q.shape[:-2] != k.shape[:-2]):
        raise ValueError(f"flash_attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         f"(need (..., T_q, d), (..., T_k, d), (..., T_k, d_v) with the same leading dims)")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"flash_attention: q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; give them one dtype")
    if mask is not None:
        scores = q.shape[:-1] + k.shape[-2:-1]
        mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask)
        if mask.dtype != bool:
            raise ValueError(f"flash_attention: mask must be boolean (True = may attend), got {mask.dtype}")
        try:
            if np.broadcast_shapes(mask.shape, scores) != scores:
                raise ValueError
        except ValueError:
            raise ValueError(f"flash_attention: mask {mask.shape} does not broadcast to the scores {scores}") from None
        return np.broadcast_to(~mask, scores)
    return None


def flash_attention(q, k, v, causal=False, mask=None, scale=None, block_q=64, block_k=64, return_lse=False):
    """softmax(s·q kᵀ) v over the last two axes of (..., T, d) tensors, s = 1/√d unless `scale`
    is given, computed in tiles of block_q queries × block_k keys (any sizes ≥ 1). `causal` hides
    later keys (top-left aligned); `mask` (bool, True = may attend, broadcastable to (..., T_q,
    T_k)) hides others; both may be given. With return_lse, also L = log Σ_j e^(s·q·k_j) per query
    (a tensor without gradient)."""
    hidden = check_flash_args(q, k, v, mask, block_q, block_k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lse = np.empty(q.shape[:-1], dtypes.accumulate_dtype(q.dtype)) if return_lse else None
    out = FlashAttention.apply(q, k, v, scale=scale, causal=bool(causal), hidden=hidden, block_q=int(block_q),
                               block_k=int(block_k), lse_out=lse)
    return (out, Tensor(lse)) if return_lse else out
