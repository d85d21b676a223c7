"""Sorting along a dim: `sort`, `argsort`, `topk`, with PyTorch's names and results
(`(values, indices)` for sort and topk). The indices carry no gradient; the values are
the input taken at them (reductions.TakeAlong), so the gradient of each value goes back
to the one element it came from.
"""
import numpy as np

from minitensor import comparison
from minitensor.reductions import TakeAlong, ValuesIndices
from minitensor.shape_ops import check_dim
from minitensor.tensor import Tensor


def _order(x, axis, descending):
    """The permutation that sorts `x` along `axis`, always stable: equal elements keep
    their order. Descending sorts the reversed array ascending and reverses back, so
    ties keep their order there too."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    return n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)


def argsort(a, dim=-1, descending=False, stable=False):
    """The int64 indices that sort `a` along `dim` (NaN last, as the largest). Every sort
    here is stable, `stable=False` (the default) included: ties keep their order, as
    PyTorch's `stable=True` promises (and its CPU sort gives by default)."""
    dim = check_dim("argsort", dim, a.ndim or 1, a.shape)
    if a.ndim == 0:
        return Tensor(np.int64(0))
    return comparison.discrete(lambda x: _order(x, dim, descending).astype(np.int64), a)


def sort(a, dim=-1, descending=False, stable=False):
    """`(values, indices)`: `a` sorted along `dim`, and where each value came from."""
    indices = argsort(a, dim, descending, stable)
    if a.ndim == 0:
        return ValuesIndices(a * 1, indices)
    return ValuesIndices(TakeAlong.apply(a, indices, axis=dim % a.ndim, keepdims=True),
                         indices)


def topk(a, k, dim=-1, largest=True, sorted=True):
    """`(values, indices)` of the k largest (or smallest) entries along `dim`, in order."""
    n = a.shape[check_dim("topk", dim, a.ndim or 1, a.shape)] if a.ndim else 1
    if not 0 <= k <= n:
        raise IndexError(f"topk: k = {k} is out of range [0, {n}] for dim {dim} of {a.shape}")
    if a.ndim == 0:
        return sort(a)
    dim = dim % a.ndim
    order = argsort(a, dim, descending=largest, stable=True)
    first = order.data[(slice(None),) * dim + (slice(0, k),)]
    first = Tensor(first)
    return ValuesIndices(TakeAlong.apply(a, first, axis=dim, keepdims=True), first)
