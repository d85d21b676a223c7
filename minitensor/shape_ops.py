"""Differentiable ops that move elements around without changing their values."""
import numpy as np

from minitensor.autograd import Function
from minitensor.errors import ShapeError
from minitensor.operands import dtype_mismatch
from minitensor.tensor import Tensor


class Reshape(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, grad):
        return grad.reshape(self.shape)


class Permute(Function):
    def forward(self, a, axes):
        self.inverse = tuple(sorted(range(len(axes)), key=axes.__getitem__))  # where each axis went
        return a.transpose(axes)

    def backward(self, grad):
        return grad.transpose(self.inverse)


def _is_basic_index(index):
    """Basic (slice/int/None/Ellipsis) indexing never repeats an element."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (slice, int, np.integer)) for p in parts)


def torch_order(index):
    """`index` as (ints first, the rest): PyTorch applies integer indices as basic ones
    before any advanced (array) index, so `x[0, :, [0, 1]]` of a (2, 3, 4, 5) tensor is
    (3, 2, 5); numpy counts the 0 as advanced, puts the broadcast dims first, (2, 3, 5).
    With both kinds present, the first part (ints, and `:` for every other dim) is a view
    and the second (the rest, ints dropped) indexes it; otherwise the first part is None."""
    parts = index if isinstance(index, tuple) else (index,)
    ints = [isinstance(p, (int, np.integer)) and not isinstance(p, (bool, np.bool_)) for p in parts]
    if not any(ints) or _is_basic_index(index):
        return None, index
    first = []
    for p, is_int in zip(parts, ints):
        if is_int or p is Ellipsis:
            first.append(p)
        elif p is not None:  # a new axis takes no dim; a bool mask one per dim of its own
            first += [slice(None)] * (np.ndim(p) if np.asarray(p).dtype == np.bool_ else 1)
    rest = tuple(p for p, is_int in zip(parts, ints) if not is_int)
    return tuple(first), rest


def indexed(array, index):
    """The part of `array` that `index` picks, as PyTorch orders its dims: `(view, rest)` with
    `view[rest]` that part (to read, write, or add into; minitensor.indexing)."""
    first, rest = torch_order(index)
    return (array if first is None else array[first]), rest


class GetItem(Function):
    """`a[index]` with PyTorch's order of dims (torch_order); backward scatters the gradient
    back, adding where an index repeats: da[index] += dy."""

    def forward(self, a, index):
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        view, rest = indexed(a, index)
        return view[rest]

    def backward(self, grad):
        out = np.zeros(self.shape, self.dtype)
        view, rest = indexed(out, self.index)  # a view of out: writing into it writes into out
        if _is_basic_index(rest):
            view[rest] = grad
        else:
            np.add.at(view, rest, grad)
        return out


class Concat(Function):
    def forward(self, *arrays, axis):
        self.axis = axis
        self.bounds = np.cumsum([a.shape[axis] for a in arrays])[:-1]
        return np.concatenate(arrays, axis=axis)

    def backward(self, grad):
        return tuple(np.split(grad, self.bounds, axis=self.axis))


class Stack(Function):
    def forward(self, *arrays, axis):
        self.axis = axis
        return np.stack(arrays, axis=axis)

    def backward(self, grad):
        return tuple(np.moveaxis(grad, self.axis, 0))


def dims_from_args(dims):
    """`f(2, 3)` and `f((2, 3))` alike, as PyTorch allows: the dims as one tuple."""
    return tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims


def check_dim(op, dim, n, shape):
    """`dim` in [−n, n) as a non-negative index; out of range is an error naming it and the shape."""
    if not -n <= dim < n:
        raise IndexError(f"{op}: dim {dim} is out of range [{-n}, {n}) for a tensor of shape {shape}")
    return dim % n


def reshape(a, *shape):
    shape = dims_from_args(shape)
    try:
        return Reshape.apply(a, shape=shape)
    except ValueError:
        raise ShapeError(f"reshape: cannot reshape {a.shape} ({a.size} elements) into {shape}") from None


def flatten(a, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim (inclusive) into one, as `torch.flatten`."""
    if a.ndim == 0:
        return Reshape.apply(a, shape=(1,))
    start, end = check_dim("flatten", start_dim, a.ndim, a.shape), check_dim("flatten", end_dim, a.ndim, a.shape)
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {a.shape}")
    return Reshape.apply(a, shape=a.shape[:start] + (-1,) + a.shape[end + 1:])


def unsqueeze(a, dim):
    """A new size-1 dim at position `dim` (−ndim−1 ≤ dim ≤ ndim)."""
    dim = check_dim("unsqueeze", dim, a.ndim + 1, a.shape)
    return Reshape.apply(a, shape=a.shape[:dim] + (1,) + a.shape[dim:])


def squeeze(a, dim=None):
    """Drop size-1 dims: all of them, or only `dim` (left as is when its size is not 1, as in PyTorch)."""
    dims = range(a.ndim) if dim is None else [check_dim("squeeze", dim, a.ndim or 1, a.shape)]
    drop = {d for d in dims if a.ndim and a.shape[d] == 1}
    return Reshape.apply(a, shape=tuple(n for d, n in enumerate(a.shape) if d not in drop))


def permute(a, *axes):
    axes = dims_from_args(axes)
    if sorted(ax % a.ndim for ax in axes) != list(range(a.ndim)):
        raise ShapeError(f"permute: {axes} is not a permutation of the {a.ndim} axes of {a.shape}")
    return Permute.apply(a, axes=tuple(ax % a.ndim for ax in axes))


def transpose(a, *axes):
    """With no axes, reverse them (numpy's `.T`); with two, swap those two."""
    if not axes:
        return permute(a, tuple(reversed(range(a.ndim))))
    return swapaxes(a, *axes)


def t(a):
    """Transpose of a matrix (a tensor of ≤ 2 dims is returned transposed, as `torch.t`)."""
    if a.ndim > 2:
        raise ValueError(f"t: needs a tensor of at most 2 dims, got shape {a.shape}; use transpose(dim0, dim1)")
    return transpose(a)


def swapaxes(a, axis1, axis2):
    i, j = (check_dim("transpose", axis, a.ndim or 1, a.shape) for axis in (axis1, axis2))
    axes = list(range(a.ndim))
    if a.ndim:
        axes[i], axes[j] = axes[j], axes[i]
    return permute(a, axes)


def getitem(a, index):
    if isinstance(index, Tensor):
        index = index.data
    elif isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return GetItem.apply(a, index=index)


def _check_dtypes(op, tensors):
    if not tensors:
        raise ValueError(f"{op}: needs at least one tensor")
    if len({t.dtype for t in tensors}) > 1:
        raise dtype_mismatch(op, *tensors)


def one_dim(op, dim, axis, default=0):
    """The dim an op works along, from PyTorch's `dim=` or numpy's `axis=` (one of them)."""
    if dim is not None and axis is not None:
        raise TypeError(f"{op}: got axis={axis} and dim={dim}; give one (axis is numpy's name, dim PyTorch's)")
    return default if dim is None and axis is None else dim if axis is None else axis


def concat(tensors, dim=None, *, axis=None):
    """The tensors joined along `dim` (`torch.cat`); they match in every other dim."""
    tensors = list(tensors)
    _check_dtypes("cat", tensors)
    if any(t.ndim == 0 for t in tensors):
        raise ValueError(f"cat: a 0-d tensor cannot be concatenated (shapes {[t.shape for t in tensors]}); "
                         f"use stack, or reshape it to 1 dim")
    shapes = [t.shape for t in tensors]
    dim = check_dim("cat", one_dim("cat", dim, axis), len(shapes[0]), shapes[0])
    outside = [s[:dim] + s[dim + 1:] for s in shapes]
    if any(len(s) != len(shapes[0]) or o != outside[0] for s, o in zip(shapes, outside)):
        raise ShapeError(f"cat (concat): shapes {shapes} differ outside dim {dim}")
    return Concat.apply(*tensors, axis=dim)


def stack(tensors, dim=None, *, axis=None):
    """The tensors (all of one shape) along a new dim `dim` (−ndim−1 ≤ dim ≤ ndim)."""
    tensors = list(tensors)
    _check_dtypes("stack", tensors)
    shapes = [t.shape for t in tensors]
    if len(set(shapes)) > 1:
        raise ShapeError(f"stack: shapes {shapes} differ")
    dim = check_dim("stack", one_dim("stack", dim, axis), len(shapes[0]) + 1, shapes[0])
    return Stack.apply(*tensors, axis=dim)


def split(a, split_size_or_sections, dim=None, *, axis=None):
    """Like `torch.split`: chunks of an equal size (last one smaller) or of given sizes."""
    if a.ndim == 0:
        raise ValueError("split: a 0-d tensor has no dim to split")
    dim = check_dim("split", one_dim("split", dim, axis), a.ndim, a.shape)
    length = a.shape[dim]
    if isinstance(split_size_or_sections, (int, np.integer)):
        if split_size_or_sections < 1:
            raise ValueError(f"split: chunk size must be ≥ 1, got {split_size_or_sections}")
        sizes = [split_size_or_sections] * (length // split_size_or_sections)
        if length % split_size_or_sections or not sizes:
            sizes.append(length % split_size_or_sections)  # an empty dim gives one empty chunk
    else:
        sizes = list(split_size_or_sections)
    if sum(sizes) != length:
        raise ShapeError(f"split: sizes {sizes} do not add up to {length}, the size of dim {dim} of {a.shape}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    prefix = (slice(None),) * dim
    return tuple(a[prefix + (slice(int(s), int(s) + n),)] for s, n in zip(starts, sizes))


cat = concat  # PyTorch's name
