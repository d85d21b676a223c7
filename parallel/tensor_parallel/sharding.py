"""Shards of dense tensors across a tp group, and the way back to dense.

A sharded Parameter holds one equal block of a dense tensor along `p.tp_axis`; the
dense shape (before any vocabulary padding) is `p.full_shape` (`tp_axis(p)`, `dense_shape(p)`).
Replicated parameters carry neither attribute. So any module's dense, single-device
state dict is: every parameter, all-gathered along its tp_axis and trimmed to
full_shape (a collective call: every tp rank gets the whole dict).
"""
import copy
from collections import OrderedDict

import numpy as np

from minitensor import nn

from ..data_parallel.reducer import Reducer


def divide(numerator, group, what):
    """numerator / tp, or a ValueError naming both numbers."""
    if numerator % group.size:
        raise ValueError(f"{what} {numerator} is not divisible by the tensor-parallel size {group.size}")
    return numerator // group.size


def padded_size(length, tp):
    """The smallest multiple of tp that holds `length` (a vocabulary tp does not divide):
    every shard gets the same number of rows. The planner counts with it too."""
    return -(-length // tp) * tp


def shard(full, axis, group, padded_length=None):
    """This rank's block of `full` along `axis`, after zero-padding that axis to `padded_length`."""
    padded_length = full.shape[axis] if padded_length is None else padded_length
    block = divide(padded_length, group, f"length along axis {axis} of shape {full.shape}")
    widths = [(0, 0)] * full.ndim
    widths[axis] = (0, padded_length - full.shape[axis])
    padded = np.pad(full, widths)
    return np.ascontiguousarray(np.take(padded, np.arange(group.rank * block, (group.rank + 1) * block), axis=axis))


def sharded_parameter(full, axis, group, padded_length=None):
    """A Parameter holding this rank's shard of `full`, tagged with tp_axis and full_shape."""
    p = nn.Parameter(shard(np.asarray(full), axis, group, padded_length))
    p.tp_axis, p.full_shape = axis, tuple(full.shape)
    return p


def trim(padded, full_shape):
    """Drop the padding rows (a vocabulary tp does not divide) of joined shards."""
    return np.ascontiguousarray(padded[tuple(slice(0, n) for n in full_shape)])


def gather(local, axis, full_shape, group):
    """The dense array from every rank's shard: all-gather along `axis`, trim the padding."""
    return trim(group.all_gather(np.ascontiguousarray(local), axis=axis), full_shape)


def is_sharded(p):
    return hasattr(p, "tp_axis")


def tp_axis(p):
    """The axis along which `p` is split over tp, or None for a replicated parameter."""
    return p.tp_axis if is_sharded(p) else None


def dense_shape(p):
    """The shape of `p` in the single-device model (before any vocabulary padding)."""
    return tuple(p.full_shape) if is_sharded(p) else p.shape


def replicated_copy(module, partial_grad=False):
    """A private copy of a dense module whose parameters every tp rank holds whole.

    With `partial_grad` (inside a sequence-parallel region each rank sees only its
    positions), its parameters are tagged `tp_partial_grad` for finish_grad_sync.
    """
    module = copy.deepcopy(module)
    module.zero_grad()
    if partial_grad:
        for p in module.parameters():
            p.tp_partial_grad = True
    return module


def full_state_dict(module, group):
    """Dense, single-device-named copy of every parameter (collective over the tp group)."""
    return OrderedDict((name, gather(p.data, p.tp_axis, p.full_shape, group) if is_sharded(p) else p.data.copy())
                       for name, p in module.named_parameters())


def full_grads(module, group):
    """Dense, single-device-named gradients of every parameter that has one (collective)."""
    return OrderedDict((name, gather(p.grad, p.tp_axis, p.full_shape, group) if is_sharded(p) else p.grad.copy())
                       for name, p in module.named_parameters() if p.grad is not None)


def load_full_state_dict(module, group, state):
    """Load a dense, single-device-named state dict: each rank keeps its shards."""
    params = dict(module.named_parameters())
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise KeyError(f"load_full_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    for name, p in params.items():
        value = np.asarray(state[name])
        expected = p.full_shape if is_sharded(p) else p.shape
        if value.shape != tuple(expected):
            raise ValueError(f"load_full_state_dict: '{name}' has shape {value.shape} in the checkpoint "
                             f"but {tuple(expected)} in the dense model")
        if is_sharded(p):
            value = shard(value, p.tp_axis, group, p.shape[p.tp_axis] * group.size)
        p.data[...] = value


def all_reduce_partial_grads(module, group):
    """Sum the tp-partial gradients (sequence-parallel LayerNorms, biases, positions) over
    the tp group, through the gradient reducer's flat buckets. A no-op when there are none (no SP)."""
    partial = [p for p in module.parameters() if getattr(p, "tp_partial_grad", False) and p.grad is not None]
    if partial:
        Reducer(partial, group, divisor=1).finish()
