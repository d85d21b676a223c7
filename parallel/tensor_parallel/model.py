"""A GPT, or a slice of it (minitensor.models.GPTSlice: what a pipeline stage runs), converted
to tensor parallelism in one place.

    TensorParallelStage(dense_slice, group, sequence_parallel=False, seed=0, context=None)
        tok_emb  ─▶ VocabParallelEmbedding        pos_emb, ln_f ─▶ replicated copies
        blocks.i ─▶ ParallelBlock                  lm_head       ─▶ ColumnParallelLinear (padded vocab)
        drop     ─▶ Dropout on the tp rank's replicated (or, under SP, sharded) stream
        BERT:    seg_emb ─▶ replicated copy        mlm_head      ─▶ ParallelMLMHead (on tok_emb's shard)

    TensorParallelGPT(gpt, group, ...)  is the one-stage case: the whole model.

The converted slice keeps the dense slice's module tree and parameter names; sharded
parameters carry `tp_axis` and `full_shape` (sharding.py). It inherits the GPT's
`embed` and `head` and changes only what tensor parallelism changes: under sequence
parallelism each rank adds the positions of its own slice of the sequence, (B, T/tp, C)
between embed and head, and the loss is taken over the vocabulary shards. Under context
parallelism (`context`: a ContextParallel) the slice runs on the cp rank's tokens: their
positions are added, and attention is a ring over the cp group.
"""
import numpy as np

from minitensor.models.slice import GPTSlice
from minitensor.tensor import Tensor

from .layers import ColumnParallelLinear
from .mappings import check_sequence_parallel
from .mlm_head import ParallelMLMHead
from .random import TensorParallelRNG
from .sharding import (
    all_reduce_partial_grads,
    full_grads,
    full_state_dict,
    gather,
    load_full_state_dict,
    replicated_copy,
)
from .transformer import ParallelBlock, dropout_like
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


class TensorParallelStage(GPTSlice):
    """The dense GPTSlice `dense` with every part converted to TP over `group`.

    seed: the dropout streams, TensorParallelRNG(seed + stage, tp rank): each stage draws
    its own masks, alike on the tp ranks where the activations are replicated.
    context: the cp rank's ContextParallel (its tokens, ring attention), or None."""

    def __init__(self, dense, group, sequence_parallel=False, seed=0, context=None):
        super().__init__(dense, dense.blocks.indices(), dense.stage, dense.num_stages)  # the dense parts ...
        self.group, self.sequence_parallel, self.context = group, sequence_parallel, context
        self.rng = TensorParallelRNG(seed + self.stage, group.rank)
        sp = sequence_parallel
        if self.is_first:  # ... each replaced by its TP form
            self.tok_emb = VocabParallelEmbedding(self.tok_emb, group, sequence_parallel=sp)
            self.pos_emb = replicated_copy(self.pos_emb, partial_grad=sp)  # under SP: this rank's positions only
            if "seg_emb" in self._modules:
                self.seg_emb = replicated_copy(self.seg_emb, partial_grad=sp)
            self.drop = dropout_like(self.drop, self.rng, sharded=sp)
        for index in self.blocks.indices():
            self.blocks[index] = ParallelBlock(self.blocks[index], group, sequence_parallel=sp, rng=self.rng,
                                               context=context)
        if self.is_last:
            self.ln_f = replicated_copy(self.ln_f, partial_grad=sp)
            if "lm_head" in self._modules:
                self.lm_head = ColumnParallelLinear(self.lm_head, group, sequence_parallel=sp, pad_out_features=True)
            if "mlm_head" in self._modules:
                self.mlm_head = ParallelMLMHead(self.mlm_head, group, sequence_parallel=sp)
                if not self.is_first:  # the tied embedding's copy, split as on the first stage
                    self.tok_emb = VocabParallelEmbedding(self.tok_emb, group, sequence_parallel=sp)
        self.train(dense.training)

    def positions(self, t):
        """The positions of the t tokens this rank holds: 0 .. t-1, or under CP the cp rank's
        positions in the whole sequence; under SP this tp rank's share of them."""
        positions = np.arange(t) if self.context is None else self.context.positions(t)
        if not self.sequence_parallel:
            return positions
        check_sequence_parallel(t, self.group)
        return positions.reshape(self.group.size, -1)[self.group.rank]

    def loss(self, logits, targets):
        """Cross-entropy of the vocab-sharded logits (the lm_head's output stays split); under CP
        weighted so that the cp ranks' mean is the mean over every counted token (context.py)."""
        loss = vocab_parallel_cross_entropy(logits, targets, self.group, vocab_size=self.config.vocab_size)
        return loss if self.context is None else loss * self.context.loss_weight(targets)

    def generators(self):
        return self.rng.generators()

    def activation_shape(self, batch, seq_len):
        if self.sequence_parallel:
            seq_len //= self.group.size
        return (batch, seq_len, self.config.d_model)

    def finish_grad_sync(self):
        """After backward, before the optimizer: sum the tp-partial gradients (a no-op without SP)."""
        all_reduce_partial_grads(self, self.group)

    def full_state_dict(self):
        return full_state_dict(self, self.group)

    def full_grads(self):
        return full_grads(self, self.group)

    def load_full_state_dict(self, dense_state):
        load_full_state_dict(self, self.group, dense_state)


class TensorParallelGPT(TensorParallelStage):
    """The TP version of a whole dense `minitensor.models.GPT` or `BERT` (every rank passes the same
    dense model): the one-stage case, called as the GPT is, `model(idx, targets) -> (logits, loss)`,
    with the logits split over the vocabulary (`gather_logits` joins them)."""

    def __init__(self, gpt, group, sequence_parallel=False, seed=0):
        whole = GPTSlice(gpt, range(gpt.config.n_layer), stage=0, num_stages=1)
        super().__init__(whole, group, sequence_parallel=sequence_parallel, seed=seed)

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)

    def gather_logits(self, logits):
        """The dense (B, T, vocab) logits from each rank's vocab shard (collective, no gradient)."""
        data = logits.data if isinstance(logits, Tensor) else logits
        return gather(data, data.ndim - 1, data.shape[:-1] + (self.config.vocab_size,), self.group)
