"""`ContextParallel`: the sequence split over the cp group, as the model sees it.

    ContextParallel(cp_group, layout="zigzag", comm_type="p2p")
        shard_sequence(idx)     this rank's tokens of a (B, T) batch (targets alike)
        positions(t)            the global positions of this rank's t tokens (its position
                                embeddings follow the tokens it holds)
        attend(q, k, v, ...)    attention over the group: the ring (comm_type "p2p",
                                ring_attention.py) or two all-to-alls ("a2a", ulysses.py),
                                by the model's attention kernel (dense or flash)
        loss_weight(targets)    what this rank's mean loss is scaled by (below)
        work                    unmasked (query, key) pairs this rank computed (× batch × heads)

Everything but attention acts on each token alone (embeddings, LayerNorm, MLP, the
loss per token), so a rank runs the whole model on its own tokens; only attention
talks to the other ranks. Each rank's loss is the mean over its counted tokens (targets
not ignore_index), and the losses and gradients are averaged over dp × cp. Where the
ranks count different numbers of tokens (the addition task ignores the prompt, which
sits in the first chunks) the mean of means is not the mean: rank r's loss is scaled by
cp·n_r / Σ n, so that the average over the cp ranks is Σ (loss sums) / Σ n exactly.
With nothing ignored the weight is exactly 1.
"""
import numpy as np

from minitensor.data.addition import IGNORE_INDEX
from minitensor.models.gpt import merge_heads, split_heads
from minitensor.nn.attention_kernels import DENSE

from .layout import check_layout, check_sequence_length, rank_chunks, token_positions
from .ring_attention import RingAttention
from .ulysses import ulysses_attention

COMM_TYPES = ("p2p", "a2a")  # Megatron-LM's cp_comm_type names: the ring, Ulysses


class ContextParallel:
    def __init__(self, group, layout="zigzag", comm_type="p2p"):
        check_layout(layout)
        if comm_type not in COMM_TYPES:
            raise ValueError(f"context parallel comm_type {comm_type!r} is not one of {COMM_TYPES}")
        self.group, self.layout, self.comm_type = group, layout, comm_type
        self.work = 0

    def __repr__(self):
        return (f"ContextParallel(cp={self.group.size}, layout={self.layout!r}, comm_type={self.comm_type!r}, "
                f"rank {self.group.rank})")

    def check_sequence_length(self, seq_len):
        check_sequence_length(seq_len, self.group.size, self.layout)

    def chunks(self, rank):
        """The chunk indices rank `rank` of the group holds (layout.rank_chunks)."""
        return rank_chunks(rank, self.group.size, self.layout)

    def indices(self, seq_len):
        """The global positions of this rank's tokens in a sequence of `seq_len`."""
        return token_positions(seq_len, self.group.rank, self.group.size, self.layout)

    def shard_sequence(self, array):
        """This rank's tokens (axis 1) of a (B, T) array."""
        return np.ascontiguousarray(array[:, self.indices(array.shape[1])])

    def positions(self, t):
        """The global positions of this rank's `t` tokens (of a sequence of t·cp)."""
        return self.indices(t * self.group.size)

    def check_heads(self, n_head):
        """Ulysses splits the heads over the group: a ValueError naming both numbers unless it can."""
        if self.comm_type == "a2a" and n_head % self.group.size:
            raise ValueError(f"Ulysses context parallelism (comm_type 'a2a') needs the heads per tp rank, "
                             f"{n_head}, divisible by cp = {self.group.size} (cp ≤ heads per tp rank)")

    def attend(self, q, k, v, n_head, causal, kernel=DENSE):
        """Multi-head attention over the group on this rank's projected q, k, v (B, T/cp, n_head·d),
        by `kernel` (minitensor.nn.attention_kernels): the ring computes each block pair in its tiles."""
        q, k, v = (split_heads(t, n_head) for t in (q, k, v))
        if self.comm_type == "a2a":
            return merge_heads(ulysses_attention(q, k, v, self, causal, kernel))
        return merge_heads(RingAttention.apply(q, k, v, context=self, causal=causal, tiles=kernel.tiles))

    def loss_weight(self, targets, ignore_index=IGNORE_INDEX):
        """cp·n / (n summed over the cp group), n the counted targets of this rank's micro-batch
        (a one-number all-reduce; 0 when the group counts none, as the loss is then 0)."""
        counted = np.array([np.count_nonzero(np.asarray(targets) != ignore_index)], dtype=np.int64)
        total = int(self.group.all_reduce(counted.copy())[0])
        return self.group.size * int(counted[0]) / total if total else 0.0

    def count_work(self, pairs):
        self.work += int(pairs)

    def reset_work(self):
        self.work = 0
