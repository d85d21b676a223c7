"""The conjugate communication ops of tensor parallelism (Megatron-LM's f and g and cousins).

Each op is an autograd `Function` whose backward is the forward's conjugate: what one
direction all-reduces, the other leaves alone; what one gathers, the other splits.
Layers only compose them, so every collective of a TP model is one of these six.

    op (group = the tp group)                forward                  backward
    copy_to_tensor_model_parallel_region     identity                 all-reduce        (f)
    reduce_from_tensor_model_parallel_region all-reduce               identity          (g)
    scatter_to_tensor_model_parallel_region  split last axis          all-gather last axis
    gather_from_tensor_model_parallel_region all-gather last axis     split last axis
    gather_from_sequence_parallel_region     all-gather sequence      reduce-scatter sequence
    reduce_scatter_to_sequence_parallel_region reduce-scatter sequence all-gather sequence

Activations are (batch, sequence, hidden): the sequence axis is axis 1.
"""
import numpy as np

from minitensor.autograd import Function

SEQUENCE_AXIS = 1


def chunk_of(array, axis, group):
    """This rank's equal, contiguous chunk of `array` along `axis`."""
    length = array.shape[axis]
    if length % group.size:
        raise ValueError(f"cannot split axis {axis} of length {length} (shape {array.shape}) "
                         f"evenly over the tensor-parallel size {group.size}")
    size = length // group.size
    index = [slice(None)] * array.ndim
    index[axis] = slice(group.rank * size, (group.rank + 1) * size)
    return np.ascontiguousarray(array[tuple(index)])


def check_sequence_parallel(seq_len, group):
    if seq_len % group.size:
        raise ValueError(f"sequence parallelism needs the sequence length {seq_len} "
                         f"to be divisible by the tensor-parallel size {group.size}")


class CopyToTensorModelParallelRegion(Function):
    """f. Every rank feeds the same x to its own weight shard, so x's gradient is the
    sum of the ranks' partial gradients: identity forward, all-reduce backward."""

    def forward(self, x, group):
        self.group = group
        return x

    def backward(self, grad):
        # exercise 05.1: the conjugate f and g
        # hint: f's backward sums the ranks' partial input gradients: an all-reduce over self.group
        # hint: (of a copy: never overwrite the incoming gradient).
        return self.group.all_reduce(np.array(grad, copy=True))
        # end exercise


class ReduceFromTensorModelParallelRegion(Function):
    """g. Each rank holds a partial sum of the output (its slice of the contraction);
    the sum is needed everywhere. The sum's gradient reaches every term unchanged."""

    def forward(self, x, group):
        # exercise 05.1: the conjugate f and g
        # hint: g's forward sums the ranks' partial outputs: an all-reduce over `group` (of a copy).
        return group.all_reduce(np.array(x, copy=True))
        # end exercise

    def backward(self, grad):
        return grad


class ScatterToTensorModelParallelRegion(Function):
    """Keep this rank's slice of the last axis; the gradient of the whole is the slices'
    gradients side by side, gathered from every rank."""

    def forward(self, x, group):
        self.group = group
        return chunk_of(x, -1, group)

    def backward(self, grad):
        return self.group.all_gather(grad, axis=-1)


class GatherFromTensorModelParallelRegion(Function):
    """Concatenate every rank's slice of the last axis; each slice's gradient is its part
    of the whole gradient (every rank already holds the whole gradient)."""

    def forward(self, x, group):
        self.group = group
        return group.all_gather(x, axis=-1)

    def backward(self, grad):
        return chunk_of(grad, -1, self.group)


class GatherFromSequenceParallelRegion(Function):
    """Sequence parallelism's f: the sequence-sharded activations are gathered whole for the
    column-parallel layer. Each rank's whole-sequence gradient is partial (its weight shard
    only), so the backward sums them and hands each rank its own positions: reduce-scatter."""

    def forward(self, x, group):
        self.group = group
        return group.all_gather(x, axis=SEQUENCE_AXIS)

    def backward(self, grad):
        return self.group.reduce_scatter(grad, axis=SEQUENCE_AXIS)


class ReduceScatterToSequenceParallelRegion(Function):
    """Sequence parallelism's g: the row-parallel layer's partial sums are summed and each
    rank keeps only its positions. Every rank's (equal) whole-sequence gradient is the
    gathered gradients of the positions."""

    def forward(self, x, group):
        self.group = group
        check_sequence_parallel(x.shape[SEQUENCE_AXIS], group)
        return group.reduce_scatter(x, axis=SEQUENCE_AXIS)

    def backward(self, grad):
        return self.group.all_gather(grad, axis=SEQUENCE_AXIS)


def on_group(mapping, x, group):
    """`mapping` applied over the tp group. On one rank every mapping is the identity (a sum, a
    gather or a split over one rank leaves x as it is), so it is skipped: no node, no copy.
    Megatron-LM's mappings return their input on one rank too."""
    return x if group.size == 1 else mapping.apply(x, group=group)


def copy_to_tensor_model_parallel_region(x, group):
    return on_group(CopyToTensorModelParallelRegion, x, group)


def reduce_from_tensor_model_parallel_region(x, group):
    return on_group(ReduceFromTensorModelParallelRegion, x, group)


def scatter_to_tensor_model_parallel_region(x, group):
    return on_group(ScatterToTensorModelParallelRegion, x, group)


def gather_from_tensor_model_parallel_region(x, group):
    return on_group(GatherFromTensorModelParallelRegion, x, group)


def gather_from_sequence_parallel_region(x, group):
    return on_group(GatherFromSequenceParallelRegion, x, group)


def reduce_scatter_to_sequence_parallel_region(x, group):
    return on_group(ReduceScatterToSequenceParallelRegion, x, group)
