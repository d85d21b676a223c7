"""Column- and row-parallel linear layers (Megatron-LM, Shoeybi et al. 2019, section 3).

For y = x Wᵀ + b with W of shape (out, in):

    column-parallel: W split by rows (output features). Each rank computes its slice of
        y from the whole x: x must be the same on every rank (f in front), and y stays
        split along its last axis unless gathered.
    row-parallel:    W split by columns (input features). Each rank contracts its slice
        of x with its slice of W, giving a partial sum of y: summed by g (all-reduce).
        The bias is added once, after the sum.

Column then row (the MLP, attention) needs no communication in between.
With sequence parallelism, f becomes an all-gather along the sequence and g a
reduce-scatter along it (mappings.py).

Every TP module has one constructor, `Cls(dense, group, **options)`: it slices the dense
counterpart, so the same seed gives the same numbers on every tp count (Megatron's CPU
initialisation does the same: build the whole weight, keep this rank's part).
"""
from minitensor import nn
from minitensor.nn import functional as F

from .mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from .sharding import divide, full_state_dict, padded_size, sharded_parameter


class TensorParallelModule(nn.Module):
    """Base of the TP modules, each built as `Cls(dense, group, **options)` from a dense module."""

    def full_state_dict(self):
        """The dense counterpart's state dict (collective over the tp group)."""
        return full_state_dict(self, self.group)


def enter_column_parallel(x, group, sequence_parallel):
    """The mapping in front of column-parallel layers: f, or under SP the sequence all-gather."""
    if sequence_parallel:
        return gather_from_sequence_parallel_region(x, group)
    return copy_to_tensor_model_parallel_region(x, group)


def exit_row_parallel(y, group, sequence_parallel):
    """The mapping after row-parallel layers: g, or under SP the sequence reduce-scatter."""
    if sequence_parallel:
        return reduce_scatter_to_sequence_parallel_region(y, group)
    return reduce_from_tensor_model_parallel_region(y, group)


class ColumnParallelLinear(TensorParallelModule):
    """The dense nn.Linear `dense` split by output features over `group`:
    weight (out/tp, in), bias (out/tp,). `pad_out_features` pads `out` up to a multiple of
    tp with zero rows (the lm_head over a vocabulary tp does not divide)."""

    def __init__(self, dense, group, gather_output=False, sequence_parallel=False, pad_out_features=False):
        super().__init__()
        out_features, self.in_features = dense.weight.shape
        padded = padded_size(out_features, group.size) if pad_out_features else out_features
        divide(padded, group, "ColumnParallelLinear: out_features")
        if gather_output and padded != out_features:
            raise ValueError(f"ColumnParallelLinear: gather_output needs out_features {out_features} "
                             f"divisible by the tensor-parallel size {group.size} (no padding)")
        self.out_features, self.group = out_features, group
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.weight = sharded_parameter(dense.weight.data, 0, group, padded)
        self.bias = sharded_parameter(dense.bias.data, 0, group, padded) if dense.bias is not None else None
        self.fp8 = None  # FP8 scaling state (minitensor.fp8), set by an FP8 precision policy

    def local(self, x):
        """This rank's output features from an input already in the parallel region."""
        return F.linear(x, self.weight, self.bias, fp8=self.fp8)

    def forward(self, x):
        # exercise 05.2: column-parallel forward
        # hint: enter the parallel region (enter_column_parallel: f), apply this rank's rows of the weight
        # hint: (self.local), and gather the output's last axis only if self.gather_output.
        y = self.local(enter_column_parallel(x, self.group, self.sequence_parallel))
        return gather_from_tensor_model_parallel_region(y, self.group) if self.gather_output else y
        # end exercise


class RowParallelLinear(TensorParallelModule):
    """The dense nn.Linear `dense` split by input features over `group`: weight (out, in/tp), bias (out,) replicated and added after the reduction.

    Under sequence parallelism the bias is added to the rank's positions only, so its
    gradient is a partial sum: tagged `tp_partial_grad`.
    """

    def __init__(self, dense, group, input_is_parallel=True, sequence_parallel=False):
        super().__init__()
        self.out_features, self.in_features = dense.weight.shape
        divide(self.in_features, group, "RowParallelLinear: in_features")
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel needs input_is_parallel=True")
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        self.weight = sharded_parameter(dense.weight.data, 1, group)
        self.fp8 = None  # FP8 scaling state (minitensor.fp8), set by an FP8 precision policy
        self.bias = None
        if dense.bias is not None:
            self.bias = nn.Parameter(dense.bias.data.copy())
            if sequence_parallel:
                self.bias.tp_partial_grad = True

    def forward(self, x):
        # exercise 05.3: row-parallel forward
        # hint: scatter x's last axis unless self.input_is_parallel; F.linear with this rank's columns of the
        # hint: weight gives a partial sum: exit_row_parallel (g) sums it; add the bias once, after the sum.
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x, self.group)
        y = exit_row_parallel(F.linear(x, self.weight, fp8=self.fp8), self.group, self.sequence_parallel)
        return y + self.bias if self.bias is not None else y
        # end exercise
