"""A whole GPT under tensor parallelism, converted from the dense one in one call.

    tp = parallel.tensor_parallel_gpt(gpt, group, sequence_parallel=False, seed=0)

The TP model has the dense model's module tree and parameter names; sharded
parameters carry `tp_axis` and `full_shape`. The conversion is done per part, so a
pipeline stage can convert only the parts it holds and register them under the same
names (`tok_emb`, `pos_emb`, `drop` | `blocks.{i}` | `ln_f`, `lm_head`):

    tensor_parallel_embedding(gpt, group, rng, sp) -> {"tok_emb", "pos_emb", "drop"}
    tensor_parallel_block(block, group, rng, sp)   -> ParallelBlock
    tensor_parallel_head(gpt, group, sp)            -> {"ln_f", "lm_head"}

and run them with `parallel_embed(stage, idx)`, the blocks, `parallel_head(stage, x, targets)`.
Under sequence parallelism the activations between embed and head are the rank's
slice of the sequence, (B, T/tp, C).
"""
from collections import OrderedDict

import numpy as np

from minitensor import nn
from minitensor.tensor import Tensor

from .layers import ColumnParallelLinear
from .mappings import check_sequence_parallel
from .random import TensorParallelRNG
from .sharding import all_reduce_partial_grads, full_grads, full_state_dict, gather, load_full_state_dict, \
    replicated_copy
from .transformer import ParallelBlock, dropout_like
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


def tensor_parallel_embedding(owner, group, rng, sequence_parallel=False):
    """TP versions of `owner.tok_emb` (vocab-parallel), `owner.pos_emb` (replicated) and `owner.drop`.

    Under SP each rank adds the positions of its own slice of the sequence only, so
    the position table's gradient is partial: tagged `tp_partial_grad`.
    """
    return OrderedDict(
        tok_emb=VocabParallelEmbedding.from_dense(owner.tok_emb, group, sequence_parallel=sequence_parallel),
        pos_emb=replicated_copy(owner.pos_emb, partial_grad=sequence_parallel),
        drop=dropout_like(owner.drop, rng, sharded=sequence_parallel),
    )


def tensor_parallel_block(block, group, rng, sequence_parallel=False):
    return ParallelBlock.from_dense(block, group, sequence_parallel=sequence_parallel, rng=rng)


def tensor_parallel_head(owner, group, sequence_parallel=False):
    """TP versions of `owner.ln_f` (replicated) and `owner.lm_head` (column-parallel over the
    padded vocabulary; its output stays sharded into vocab_parallel_cross_entropy)."""
    return OrderedDict(
        ln_f=replicated_copy(owner.ln_f, partial_grad=sequence_parallel),
        lm_head=ColumnParallelLinear.from_dense(owner.lm_head, group, sequence_parallel=sequence_parallel,
                                                pad_out_features=True),
    )


def parallel_embed(stage, idx):
    """GPT.embed on a stage holding the TP embedding part; (B, T/tp, C) under SP."""
    idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
    t, block_size = idx.shape[-1], stage.pos_emb.weight.shape[0]
    if t > block_size:
        raise ValueError(f"GPT: sequence length {t} exceeds block_size {block_size}")
    positions = np.arange(t)
    tok_emb = stage.tok_emb
    if tok_emb.sequence_parallel:
        check_sequence_parallel(t, tok_emb.group)
        positions = positions.reshape(tok_emb.group.size, -1)[tok_emb.group.rank]
    return stage.drop(tok_emb(idx) + stage.pos_emb(positions))


def parallel_head(stage, x, targets=None):
    """GPT.head on a stage holding the TP head part: (vocab-sharded logits, mean loss or None)."""
    logits = stage.lm_head(stage.ln_f(x))
    if targets is None:
        return logits, None
    return logits, vocab_parallel_cross_entropy(logits, targets, stage.lm_head.group,
                                                vocab_size=stage.lm_head.out_features)


class TensorParallelGPT(nn.Module):
    """The TP version of a dense `minitensor.models.GPT` (see the module docstring)."""

    def __init__(self, gpt, group, sequence_parallel=False, seed=0):
        super().__init__()
        self.config, self.group, self.sequence_parallel = gpt.config, group, sequence_parallel
        self.rng = TensorParallelRNG(seed, group.rank)
        for name, module in tensor_parallel_embedding(gpt, group, self.rng, sequence_parallel).items():
            setattr(self, name, module)
        self.blocks = nn.ModuleList(tensor_parallel_block(b, group, self.rng, sequence_parallel) for b in gpt.blocks)
        for name, module in tensor_parallel_head(gpt, group, sequence_parallel).items():
            setattr(self, name, module)
        self.train(gpt.training)

    @classmethod
    def from_dense(cls, gpt, group, sequence_parallel=False, seed=0):
        return cls(gpt, group, sequence_parallel=sequence_parallel, seed=seed)

    def embed(self, idx):
        return parallel_embed(self, idx)

    def head(self, x, targets=None):
        return parallel_head(self, x, targets)

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)

    def finish_grad_sync(self):
        """After backward, before the optimizer: sum the tp-partial gradients (a no-op without SP)."""
        all_reduce_partial_grads(self, self.group)

    def full_state_dict(self):
        return full_state_dict(self, self.group)

    def full_grads(self):
        return full_grads(self, self.group)

    def load_full_state_dict(self, dense_state):
        load_full_state_dict(self, self.group, dense_state)

    def gather_logits(self, logits):
        """The dense (B, T, vocab) logits from each rank's vocab shard (collective, no gradient)."""
        data = logits.data if isinstance(logits, Tensor) else logits
        return gather(data, data.ndim - 1, data.shape[:-1] + (self.config.vocab_size,), self.group)


def tensor_parallel_gpt(gpt, group, sequence_parallel=False, seed=0):
    """Convert a dense GPT to its TP version over `group` (every rank passes the same dense GPT)."""
    return TensorParallelGPT(gpt, group, sequence_parallel=sequence_parallel, seed=seed)
