"""Differentiable ops that move elements around without changing their values."""
import numpy as np

from minitensor import ops
from minitensor.autograd import Function
from minitensor.tensor import Tensor


class Reshape(Function):
    def forward(self, a, shape):
        self.shape = a.shape
        return a.reshape(shape)

    def backward(self, grad):
        return grad.reshape(self.shape)


class Permute(Function):
    def forward(self, a, axes):
        self.inverse = np.argsort(axes)
        return np.transpose(a, axes)

    def backward(self, grad):
        return np.transpose(grad, self.inverse)


def _is_basic_index(index):
    """Basic (slice/int/None/Ellipsis) indexing never repeats an element."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (slice, int, np.integer)) for p in parts)


class GetItem(Function):
    """`a[index]`; backward scatters the gradient back, adding where an index repeats."""

    def forward(self, a, index):
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        return a[index]

    def backward(self, grad):
        out = np.zeros(self.shape, self.dtype)
        if _is_basic_index(self.index):
            out[self.index] = grad
        else:
            np.add.at(out, self.index, grad)
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
        raise ValueError(f"reshape: cannot reshape {a.shape} ({a.size} elements) into {shape}") from None


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
        raise ValueError(f"permute: {axes} is not a permutation of the {a.ndim} axes of {a.shape}")
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
    axes = list(range(a.ndim))
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
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
        raise ops.dtype_mismatch(op, *tensors)


def concat(tensors, axis=0):
    tensors = list(tensors)
    _check_dtypes("concat", tensors)
    axis = axis % tensors[0].ndim
    shapes = [t.shape for t in tensors]
    outside = [s[:axis] + s[axis + 1 :] for s in shapes]
    if any(len(s) != len(shapes[0]) or o != outside[0] for s, o in zip(shapes, outside)):
        raise ValueError(f"concat: shapes {shapes} differ outside axis {axis}")
    return Concat.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    tensors = list(tensors)
    _check_dtypes("stack", tensors)
    shapes = [t.shape for t in tensors]
    if len(set(shapes)) > 1:
        raise ValueError(f"stack: shapes {shapes} differ")
    return Stack.apply(*tensors, axis=axis % (tensors[0].ndim + 1))


def split(a, split_size_or_sections, axis=0):
    """Like `torch.split`: chunks of an equal size (last one smaller) or of given sizes."""
    length = a.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        if split_size_or_sections < 1:
            raise ValueError(f"split: chunk size must be ≥ 1, got {split_size_or_sections}")
        sizes = [split_size_or_sections] * (length // split_size_or_sections)
        if length % split_size_or_sections:
            sizes.append(length % split_size_or_sections)
    else:
        sizes = list(split_size_or_sections)
    if sum(sizes) != length:
        raise ValueError(f"split: sizes {sizes} do not add up to {length}, the size of axis {axis} of {a.shape}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    prefix = (slice(None),) * (axis % a.ndim)
    return tuple(a[prefix + (slice(int(s), int(s) + n),)] for s, n in zip(starts, sizes))
