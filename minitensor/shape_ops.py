"""Differentiable ops that move elements around without changing their values."""
import numpy as np

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


def reshape(a, *shape):
    shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
    try:
        return Reshape.apply(a, shape=shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape {a.shape} ({a.size} elements) into {shape}") from None


def permute(a, *axes):
    axes = tuple(axes[0]) if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)) else axes
    if sorted(ax % a.ndim for ax in axes) != list(range(a.ndim)):
        raise ValueError(f"permute: {axes} is not a permutation of the {a.ndim} axes of {a.shape}")
    return Permute.apply(a, axes=tuple(ax % a.ndim for ax in axes))


def transpose(a, *axes):
    """With no axes, reverse them (numpy's `.T`); with two, swap those two."""
    if not axes:
        return permute(a, tuple(reversed(range(a.ndim))))
    return swapaxes(a, *axes)


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
        raise TypeError(f"{op}: dtypes {[str(t.dtype) for t in tensors]} differ")


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
