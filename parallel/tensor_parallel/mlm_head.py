"""BERT's MLM head under tensor parallelism: the output layer tied to a vocab-parallel embedding.

    h = LN(gelu(dense(x)))             replicated (under SP: on the rank's slice of the sequence)
    logits_rank = f(h) · E_rankᵀ + b_rank  E_rank: this rank's rows of the token embedding, the
                                          very shard VocabParallelEmbedding looks tokens up in

So the tied weight is split the same way in both of its uses (vocabulary rows), the logits
stay split over the vocabulary, and vocab_parallel_cross_entropy takes them as they are.
The padding rows of a vocabulary tp does not divide are zero in E and in the bias: their
logits are masked by the cross-entropy and get no gradient.
"""
from minitensor.models.bert import MLMHead
from minitensor.nn import functional as F

from .layers import TensorParallelModule, enter_column_parallel
from .sharding import padded_size, replicated_copy, sharded_parameter


class ParallelMLMHead(TensorParallelModule):
    """The dense MLMHead `dense` with its bias split like the vocabulary over `group`."""

    transform = MLMHead.transform  # the same dense → GELU → LayerNorm, on replicated copies

    def __init__(self, dense, group, sequence_parallel=False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.dense = replicated_copy(dense.dense, partial_grad=sequence_parallel)
        self.norm = replicated_copy(dense.norm, partial_grad=sequence_parallel)
        vocab = dense.bias.shape[0]
        self.bias = sharded_parameter(dense.bias.data, 0, group, padded_size(vocab, group.size))

    def forward(self, x, embedding_weight):
        """`embedding_weight`: this rank's (padded V/tp, C) shard of the tied token embedding."""
        h = enter_column_parallel(self.transform(x), self.group, self.sequence_parallel)
        return F.linear(h, embedding_weight, self.bias)
