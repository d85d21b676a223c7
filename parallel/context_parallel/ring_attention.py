"""Ring attention: attention over a sequence split across the cp group (Liu et al. 2023;
Megatron-LM's context parallelism with point-to-point communication).

Each rank holds the queries, keys and values of its own tokens (layout.py says which).
Attention needs every key, so the K/V blocks travel around the ring of cp ranks:

    step i on rank r (i = 0 .. cp−1) holds the K/V block of rank (r − i) mod cp:
        start passing it on: isend to r+1, irecv the next from r−1    (non-blocking, first)
        attend r's query chunks to its key chunks: past chunks whole, the diagonal chunk
            under the causal mask, future chunks skipped
        merge each partial output into the running one (the log-sum-exp rule below)
        wait for the next block (it travelled while this one was computed)

Online softmax. For one query and a block of keys with scores s_j, a block's output and
log-sum-exp are O_b = Σ_j e^(s_j − L_b)·v_j and L_b = log Σ_j e^(s_j). Two blocks merge as

    L = log(e^L1 + e^L2),   O = e^(L1 − L)·O1 + e^(L2 − L)·O2

(substitute O_b: both sides are Σ_j e^(s_j − L)·v_j over the union). Computing L with
logaddexp and every exponent as a difference ≤ 0 keeps it finite for any scores.

Each block pair runs the tiled kernel of minitensor/nn/flash_attention.py: in tiles of the
model's flash attention kernel, or in one tile (the dense computation). Backward (flash
attention's, per block) keeps only O and L, not the probabilities: with
P = e^(S − L) recomputed per block and D = rowsum(dO ⊙ O),

    dV = Pᵀ·dO,   dS = P ⊙ (dO·Vᵀ − D),   dQ = dS·K / √d,   dK = dSᵀ·Q / √d

Each rank's dQ stays home; the dK/dV of a block are summed on every rank its queries
visit, so they travel the ring with K and V and come home after cp hops.
"""
import math

import numpy as np

from minitensor.autograd import Function
from minitensor.nn.flash_attention import tiled_backward, tiled_forward

from .layout import causal_relation, unmasked_pairs

FORWARD_TAG, BACKWARD_TAG, GRAD_TAG = 0, 2, 4  # each shift uses tag, tag + 1 (K and V, or dK and dV)


class RingShift:
    """Send `arrays` to the next rank of the ring and receive as many of the same shapes
    from the previous one, non-blocking; wait() returns the received arrays."""

    def __init__(self, group, arrays, tag):
        after, before = (group.rank + 1) % group.size, (group.rank - 1) % group.size
        self.received = [np.empty_like(a) for a in arrays]
        self.requests = [group.irecv(buf, before, tag + i) for i, buf in enumerate(self.received)]
        self.requests += [group.isend(a, after, tag + i) for i, a in enumerate(arrays)]

    def wait(self):
        for request in self.requests:
            request.wait()
        return self.received


def block_attention(q, k, v, scale, diagonal, tiles=None):
    """(output, log-sum-exp) of queries q against one block of keys k and values v (the
    diagonal block under the causal mask), by the tiled kernel in tiles (B_r, B_c) of the
    model's attention kernel; None: the whole block as one tile, the dense computation."""
    block_q, block_k = tiles or (q.shape[-2], k.shape[-2])
    return tiled_forward(q, k, v, scale, causal=diagonal, block_q=block_q, block_k=block_k)


def merge_partial(out, lse, block_out, block_lse):
    """Fold one block's (output, log-sum-exp) into the running (out, lse), in place."""
    # exercise 16.1: the log-sum-exp merge
    # hint: each output is normalised over its own keys; its log-sum-exp says how much those keys weigh in
    # hint: the union (the README's merge). Get the union's log-sum-exp without exponentiating a large number,
    # hint: reweight both outputs by their shares, and update out and lse in place: the caller keeps them.
    merged = np.logaddexp(lse, block_lse)
    out *= np.exp(lse - merged)[..., None]
    out += np.exp(block_lse - merged)[..., None] * block_out
    lse[...] = merged
    # end exercise


def block_attention_backward(q, k, v, dout, lse, delta, scale, diagonal, tiles=None):
    """(dq, dk, dv) of one block, from the final log-sum-exp lse and delta = rowsum(dO ⊙ O)."""
    block_q, block_k = tiles or (q.shape[-2], k.shape[-2])
    return tiled_backward(q, k, v, dout, lse, delta, scale, causal=diagonal, block_q=block_q, block_k=block_k)


def chunk_pairs(q_chunks, k_chunks, size, causal):
    """(query rows, key columns, diagonal?, unmasked pairs) for every pair of a local query
    chunk and a key chunk of the block that the mask does not skip entirely."""
    for i, qc in enumerate(q_chunks):
        for j, kc in enumerate(k_chunks):
            relation = causal_relation(qc, kc) if causal else "full"
            if relation != "future":
                yield (slice(i * size, (i + 1) * size), slice(j * size, (j + 1) * size),
                       relation == "diagonal", unmasked_pairs(relation, size))


class RingAttention(Function):
    """softmax(Q Kᵀ/√d [causal]) V for this rank's tokens, K and V gathered around the ring.

    q, k, v: (B, heads, T/cp, d), this rank's tokens; context: the ContextParallel (group,
    layout; it counts the work); tiles: (B_r, B_c) of flash attention, or None (each block whole)."""

    def forward(self, q, k, v, context, causal, tiles=None):
        self.context, self.causal, self.tiles = context, causal, tiles
        group = context.group
        q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
        out, lse = np.zeros_like(q), np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
        for step, (k_block, v_block) in self.ring(group, k, v, FORWARD_TAG):
            for rows, cols, diagonal, n in self.block_pairs(group, step, q):
                block_out, block_lse = block_attention(q[..., rows, :], k_block[..., cols, :], v_block[..., cols, :],
                                                       self.scale(q), diagonal, self.tiles)
                merge_partial(out[..., rows, :], lse[..., rows], block_out, block_lse)
                context.count_work(q.shape[0] * q.shape[1] * n)
        self.save_for_backward(q, k, v, out, lse)
        return out

    def backward(self, grad):
        q, k, v, out, lse = self.saved
        group, dout = self.context.group, np.ascontiguousarray(grad)
        delta = np.vecdot(dout, out)
        dq, dk_dv = np.zeros_like(q), None
        for step, (k_block, v_block) in self.ring(group, k, v, BACKWARD_TAG):
            dk, dv = np.zeros_like(k), np.zeros_like(v)  # this step's block's share from this rank's queries
            for rows, cols, diagonal, _ in self.block_pairs(group, step, q):
                dq_part, dk_part, dv_part = block_attention_backward(
                    q[..., rows, :], k_block[..., cols, :], v_block[..., cols, :], dout[..., rows, :],
                    lse[..., rows], delta[..., rows], self.scale(q), diagonal, self.tiles)
                dq[..., rows, :] += dq_part
                dk[..., cols, :] += dk_part
                dv[..., cols, :] += dv_part
            if dk_dv is not None:  # this block's dK, dV summed by the ranks it visited before
                arrived = dk_dv.wait()
                dk += arrived[0]
                dv += arrived[1]
            dk_dv = RingShift(group, (dk, dv), GRAD_TAG) if group.size > 1 else None
        if dk_dv is not None:  # cp hops: our own block's dK, dV are home
            dk, dv = dk_dv.wait()
        return dq, dk, dv

    @staticmethod
    def scale(q):
        return 1.0 / math.sqrt(q.shape[-1])

    @staticmethod
    def ring(group, k, v, tag):
        """(step, (K, V) block held at that step), passing each block on before it is used."""
        for step in range(group.size):
            shift = RingShift(group, (k, v), tag) if step < group.size - 1 else None
            yield step, (k, v)
            if shift is not None:
                k, v = shift.wait()

    def block_pairs(self, group, step, q):
        """The chunk pairs of this rank's queries and the block that arrived at `step`."""
        context = self.context
        source = (group.rank - step) % group.size
        q_chunks, k_chunks = context.chunks(group.rank), context.chunks(source)
        return chunk_pairs(q_chunks, k_chunks, q.shape[-2] // len(q_chunks), self.causal)
