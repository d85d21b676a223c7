"""The transformer block under tensor parallelism: attention heads and MLP columns split.

    ParallelSelfAttention:  f ─▶ q, k, v column-parallel (whole heads) ─▶ attention on the
                            rank's heads ─▶ proj row-parallel ─▶ g
    ParallelMLP:            f ─▶ fc column-parallel ─▶ gelu ─▶ proj row-parallel ─▶ g

So each block does two all-reduces forward (the g's) and two backward (the f's), of
one (batch, sequence, hidden) activation each. With sequence parallelism (Korthikanti
et al. 2022) the LayerNorms and dropouts between them run on the rank's slice of the
sequence, f is an all-gather and g a reduce-scatter: the same bytes, and the
activations outside attention and MLP take 1/tp of the memory. Under context
parallelism (`context`, a context_parallel.ContextParallel) the rank's heads attend over
the whole sequence by ring attention across the cp group.

A mixture-of-experts MLP (minitensor.nn.moe) is not split: every tp rank holds its experts
whole and runs them on the activation it already holds whole (Megatron-Core's expert
tensor-parallel size 1). So it needs no tp collective and its gradients are the same on
every tp rank; sequence parallelism, which would give each tp rank other tokens, is refused.
"""
from minitensor import nn
from minitensor.models.gpt import attend
from minitensor.nn import functional as F
from minitensor.nn.moe import MoE

from .layers import ColumnParallelLinear, RowParallelLinear, TensorParallelModule, enter_column_parallel
from .random import TensorParallelRNG
from .sharding import divide, replicated_copy


def dropout_like(dense_dropout, rng, sharded):
    """The dense Dropout's probability, drawing from the tp rank's replicated or sharded stream."""
    return nn.Dropout(dense_dropout.p, generator=rng.generator(sharded))


class ParallelSelfAttention(TensorParallelModule):
    """The dense SelfAttention `dense` split by heads over `group`. rng: the tp rank's dropout
    streams (default: seed 0); context: a ContextParallel (ring attention over its cp group) or None."""

    def __init__(self, dense, group, sequence_parallel=False, rng=None, context=None):
        super().__init__()
        self.local_heads = divide(dense.n_head, group, "ParallelSelfAttention: n_head")
        if context is not None and dense.dropout:
            raise ValueError(f"attention dropout {dense.dropout} under context parallelism "
                             f"(cp={context.group.size}): ring attention has no dropout; use dropout 0")
        if context is not None:
            context.check_heads(self.local_heads)
        self.group, self.sequence_parallel, self.context = group, sequence_parallel, context
        self.causal, self.dropout, self.kernel = dense.causal, dense.dropout, dense.kernel
        self.rng = rng if rng is not None else TensorParallelRNG(0, group.rank)
        # Rows h·d .. (h+1)·d of q, k, v belong to head h, so an equal split by rows is a split by whole heads.
        self.q, self.k, self.v = (ColumnParallelLinear(lin, group, sequence_parallel=sequence_parallel)
                                  for lin in (dense.q, dense.k, dense.v))
        self.proj = RowParallelLinear(dense.proj, group, sequence_parallel=sequence_parallel)
        self.resid_drop = dropout_like(dense.resid_drop, self.rng, sharded=sequence_parallel)

    def forward(self, x):
        h = enter_column_parallel(x, self.group, self.sequence_parallel)  # once for q, k and v
        q, k, v = self.q.local(h), self.k.local(h), self.v.local(h)
        if self.context is not None:  # this rank's tokens attend to every cp rank's
            y = self.context.attend(q, k, v, self.local_heads, self.causal, self.kernel)
        else:
            with self.rng.fork_sharded():  # the attention probabilities of this rank's own heads
                y = attend(q, k, v, self.local_heads, self.causal, self.dropout, self.training, self.kernel)
        return self.resid_drop(self.proj(y))


class ParallelMLP(TensorParallelModule):
    """The dense MLP `dense` split by hidden columns over `group`."""

    def __init__(self, dense, group, sequence_parallel=False, rng=None):
        super().__init__()
        divide(dense.fc.weight.shape[0], group, "ParallelMLP: hidden size 4·d_model =")
        self.group, self.sequence_parallel = group, sequence_parallel
        rng = rng if rng is not None else TensorParallelRNG(0, group.rank)
        self.fc = ColumnParallelLinear(dense.fc, group, sequence_parallel=sequence_parallel)
        self.proj = RowParallelLinear(dense.proj, group, sequence_parallel=sequence_parallel)
        self.drop = dropout_like(dense.drop, rng, sharded=sequence_parallel)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class ParallelBlock(TensorParallelModule):
    """The dense Block `dense` with parallel attention and MLP; LayerNorms replicated
    (sequence-sharded under SP). context: ring attention's ContextParallel, or None."""

    def __init__(self, dense, group, sequence_parallel=False, rng=None, context=None):
        super().__init__()
        self.group = group
        rng = rng if rng is not None else TensorParallelRNG(0, group.rank)
        self.ln_1 = replicated_copy(dense.ln_1, partial_grad=sequence_parallel)
        self.attn = ParallelSelfAttention(dense.attn, group, sequence_parallel=sequence_parallel, rng=rng,
                                          context=context)
        self.ln_2 = replicated_copy(dense.ln_2, partial_grad=sequence_parallel)
        self.mlp = (whole_experts(dense.mlp, rng, sequence_parallel, context) if isinstance(dense.mlp, MoE) else
                    ParallelMLP(dense.mlp, group, sequence_parallel=sequence_parallel, rng=rng))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def whole_experts(moe, rng, sequence_parallel, context=None):
    """The MoE layer itself, replicated on the tp ranks: its dropout draws from their shared stream.
    (Where its balancing loss's tokens lie, over cp or dp × cp, the hybrid model tells it: MoE.set_token_group_ranks.)"""
    if sequence_parallel:
        raise ValueError("a mixture-of-experts MLP under sequence parallelism: its experts run whole on every tp "
                         "rank's activation, which SP splits by position; turn sequence parallelism off")
    if context is not None:
        if moe.capacity_factor is not None:
            raise ValueError(f"a mixture-of-experts capacity (capacity_factor={moe.capacity_factor}) under context "
                             f"parallelism: it keeps each sequence's earliest tokens first, which lie on other cp "
                             f"ranks; use dropless routing (no capacity factor)")
    moe.drop = dropout_like(moe.drop, rng, sharded=False)
    return moe
