"""Ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023; Megatron's cp_comm_type "a2a"): context
parallelism by two all-to-alls around attention instead of a ring.

    this rank: q, k, v of its s/cp tokens and all H of its heads          (B, H, s/cp, d)
      ──all-to-all──▶  all s tokens, in sequence order, H/cp of the heads  (B, H/cp, s, d)
      ──attention as on one device (causal mask and all; the model's kernel), on those heads
      ──all-to-all back──▶  its s/cp tokens, all H heads                  (B, H, s/cp, d)

An all-to-all sends piece j of this rank's array to rank j and keeps its own: cp − 1
messages of 1/cp of the array each. Per attention layer q, k and v go out and the output
comes back (4 all-to-alls forward), and backward runs the conjugate of each (4 more).
Each is (cp−1)/cp of a b·s/cp·h/tp block, whatever the layout: no online softmax, no
imbalance (every rank attends all tokens of its heads). The price: the heads must split,
H/tp divisible by cp, so cp ≤ heads per tp rank.

After the first all-to-all the tokens arrive in rank order (rank 0's, then rank 1's, ...);
`where[k]` is the position in the sequence of the k-th of them (layout.token_positions of
each rank in turn), so scattering by `where` puts them in sequence order and gathering by
it takes them back out.
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.nn.attention_kernels import DENSE

from .layout import token_positions

A2A_TAG = 6


def all_to_all(group, pieces):
    """pieces[j] goes to rank j; returns the pieces every rank sent here, in rank order
    (every piece has the shape of this rank's pieces: the exchange is symmetric)."""
    received = [np.empty_like(piece) for piece in pieces]
    received[group.rank] = pieces[group.rank]
    peers = [j for j in range(group.size) if j != group.rank]
    requests = [group.irecv(received[j], j, A2A_TAG) for j in peers]
    requests += [group.isend(np.ascontiguousarray(pieces[j]), j, A2A_TAG) for j in peers]
    for request in requests:
        request.wait()
    return received


def sequence_to_heads(x, group, where):
    """(B, H, s/cp, d) of this rank's tokens → (B, H/cp, s, d) of this rank's heads, in sequence order."""
    pieces = all_to_all(group, np.split(x, group.size, axis=1))
    out = np.empty(pieces[0].shape[:2] + (len(where),) + pieces[0].shape[3:], x.dtype)
    out[:, :, where] = np.concatenate(pieces, axis=2)
    return out


def heads_to_sequence(y, group, where):
    """The inverse: (B, H/cp, s, d) in sequence order → (B, H, s/cp, d) of this rank's tokens."""
    pieces = all_to_all(group, np.split(y[:, :, where], group.size, axis=2))
    return np.concatenate(pieces, axis=1)


class SequenceToHeads(Function):
    """All-to-all from a split sequence to split heads; its gradient goes the other way."""

    def forward(self, x, group, where):
        self.group, self.where = group, where
        return sequence_to_heads(x, group, where)

    def backward(self, grad):
        return heads_to_sequence(grad, self.group, self.where)


class HeadsToSequence(Function):
    """All-to-all from split heads back to a split sequence; its gradient goes the other way."""

    def forward(self, y, group, where):
        self.group, self.where = group, where
        return heads_to_sequence(y, group, where)

    def backward(self, grad):
        return sequence_to_heads(grad, self.group, self.where)


def ulysses_attention(q, k, v, context, causal, kernel=DENSE):
    """Attention on this rank's (B, H, s/cp, d) q, k, v tensors through two all-to-alls."""
    group, seq = context.group, q.shape[2] * context.group.size
    where = np.concatenate([token_positions(seq, r, group.size, context.layout) for r in range(group.size)])
    q, k, v = (SequenceToHeads.apply(t, group=group, where=where) for t in (q, k, v))
    pairs = seq * (seq + 1) // 2 if causal else seq * seq
    context.count_work(q.shape[0] * q.shape[1] * pairs)
    out = kernel(q, k, v, causal=causal)
    return HeadsToSequence.apply(out, group=group, where=where)
