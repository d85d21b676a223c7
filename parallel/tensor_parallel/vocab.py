"""The vocabulary split across tp ranks: embedding and cross-entropy (Megatron-LM, section 3).

Each rank holds rows [start, start + V/tp) of the (padded) vocabulary. A vocabulary
that tp does not divide is padded with zero rows up to a multiple of tp: no token
looks a padding row up, and the cross-entropy masks the padding columns to -inf, so
they never win a softmax and never receive gradient.
"""
import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function
from minitensor.nn import functional as F
from minitensor.tensor import Tensor

from .layers import TensorParallelModule
from .mappings import reduce_from_tensor_model_parallel_region, reduce_scatter_to_sequence_parallel_region
from .sharding import padded_size, sharded_parameter


def vocab_range(local_size, group):
    """[start, stop) of the vocabulary rows this rank holds."""
    return group.rank * local_size, (group.rank + 1) * local_size


class VocabParallelEmbedding(TensorParallelModule):
    """The dense nn.Embedding `dense` split by vocabulary rows over `group`: weight (padded V/tp, C).
    A token outside this rank's rows contributes zeros; the sum
    over ranks (all-reduce, or under SP a reduce-scatter along the sequence) is the lookup."""

    def __init__(self, dense, group, sequence_parallel=False):
        super().__init__()
        self.num_embeddings = dense.weight.shape[0]
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = sharded_parameter(dense.weight.data, 0, group, padded_size(self.num_embeddings, group.size))

    def forward(self, idx):
        idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise IndexError(f"VocabParallelEmbedding: indices range [{idx.min()}, {idx.max()}] "
                             f"outside [0, {self.num_embeddings})")
        # exercise 06.1: vocab-parallel embedding
        # hint: look up only the tokens in this rank's rows [start, stop) (others: row 0, then masked to zero),
        # hint: and sum over ranks: reduce_from_... (or reduce_scatter_to_sequence_... under sequence parallelism).
        start, stop = vocab_range(self.weight.shape[0], self.group)
        mine = (idx >= start) & (idx < stop)
        rows = F.embedding(np.where(mine, idx - start, 0), self.weight)
        partial = rows * Tensor(mine[..., None].astype(rows.dtype))  # zero (and no gradient) for others' tokens
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(partial, self.group)
        return reduce_from_tensor_model_parallel_region(partial, self.group)
        # end exercise


class VocabParallelCrossEntropy(Function):
    """Mean over counted tokens of logsumexp(z) − z[target], from vocab-sharded logits z.

    logsumexp = m + log Σ_ranks Σ_local exp(z − m) with m the all-reduced max, and z[target]
    is non-zero only on the rank that holds the target: three numbers per token cross the
    group (max; sum-exp and target logit in one all-reduce), never the logits.
    Backward is local: d/dz = (softmax(z) − onehot(target)) / n_counted on this rank's columns.
    16-bit logits are computed in float32, the loss returned in float32 (as CrossEntropy does).
    """

    def forward(self, logits, targets, group, vocab_size, ignore_index):
        self.dtype = logits.dtype
        (logits,) = dtypes.upcast(logits)
        # exercise 06.2: vocab-parallel cross-entropy forward
        # hint: mask padding columns (≥ vocab_size) to −inf; all-reduce the row max (op='max'); then ONE all-reduce
        # hint: of [Σ exp(z − m), target logit − m (only the rank holding the target)]; loss = mean of log Σ − picked
        # hint: over counted tokens. Save softmax, mine, local_t, counted, n and shape for backward.
        local_v = logits.shape[-1]
        start, _ = vocab_range(local_v, group)
        z = logits.reshape(-1, local_v)
        z = np.where(start + np.arange(local_v) < vocab_size, z, -np.inf)  # padding columns never win
        m = group.all_reduce(np.ascontiguousarray(z.max(axis=-1)), op="max")
        e = np.exp(z - m[:, None])

        targets = targets.reshape(-1)
        counted = targets != ignore_index
        local_t = targets - start
        mine = counted & (local_t >= 0) & (local_t < local_v)
        rows = np.arange(len(targets))
        picked = np.where(mine, z[rows, np.where(mine, local_t, 0)] - m, 0.0)
        sum_exp, target_logit = group.all_reduce(np.stack([e.sum(axis=-1), picked]))

        self.n = max(int(counted.sum()), 1)
        self.softmax = e / sum_exp[:, None]
        self.mine, self.local_t, self.counted, self.shape = mine, local_t, counted, logits.shape
        loss = ((np.log(sum_exp) - target_logit) * counted).sum() / self.n
        return np.asarray(loss, dtype=logits.dtype)
        # end exercise

    def backward(self, grad):
        d = self.softmax.copy()
        rows = np.flatnonzero(self.mine)
        d[rows, self.local_t[rows]] -= 1
        d *= (self.counted * (grad / self.n))[:, None]
        return dtypes.like(self.dtype, d.reshape(self.shape))


def vocab_parallel_cross_entropy(logits, targets, group, vocab_size=None, ignore_index=-100):
    """Mean cross-entropy of vocab-sharded `logits (..., V_padded/tp)` against `targets (...)`.

    `vocab_size` is the real vocabulary (columns beyond it are padding); default: no padding.
    Targets equal to `ignore_index` are not counted, as in minitensor's cross_entropy.
    """
    targets = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
    vocab_size = logits.shape[-1] * group.size if vocab_size is None else vocab_size
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_cross_entropy: logits {logits.shape} need targets of shape "
                         f"{logits.shape[:-1]}, got {targets.shape}")
    counted = targets[targets != ignore_index]
    if counted.size and (counted.min() < 0 or counted.max() >= vocab_size):
        raise ValueError(f"vocab_parallel_cross_entropy: targets range [{counted.min()}, {counted.max()}] "
                         f"outside the vocabulary [0, {vocab_size})")
    return VocabParallelCrossEntropy.apply(logits, targets=targets, group=group, vocab_size=vocab_size,
                                           ignore_index=ignore_index)
