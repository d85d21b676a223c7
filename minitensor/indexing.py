"""Indexing by index tensors, differentiably: item and masked assignment `y[idx] = v` (an
index put), `gather`, `scatter`/`scatter_add`, `index_select`, `masked_select`, and
`one_hot` (no gradient). Reading `x[idx]` is shape_ops.getitem; both follow PyTorch's
order of dims (shape_ops.torch_order).

`gather`/`scatter` address one element per index entry: along `dim` the entry's value,
along every other dim the entry's own position (PyTorch's `out[i][j] = x[index[i][j]][j]`
for dim 0). `along(index, dim)` writes those coordinates out as one numpy index, so each
op is a plain numpy read, write or `np.add.at`, and its backward the reverse one.
"""
import numpy as np

from minitensor import autograd, comparison, ops
from minitensor.autograd import Function, is_grad_enabled
from minitensor.errors import DTypeError, IndexRangeError, ShapeError
from minitensor.operands import dtype_mismatch, unbroadcast
from minitensor.rearrange import expand
from minitensor.shape_ops import check_dim, indexed
from minitensor.tensor import Tensor


def along(index, dim):
    """The coordinates of `x[..., index[i, j, ...] at dim, ...]`: `index` at `dim`, each
    entry's own position at every other dim (ranges that broadcast against `index`)."""
    grids = np.ogrid[tuple(slice(n) for n in index.shape)]
    return tuple(index if d == dim else grid for d, grid in enumerate(grids))


def leading(array, shape):
    """The leading `shape` part of `array` (gather and scatter read only that much of src)."""
    return array[tuple(slice(n) for n in shape)]


def padded(part, shape):
    """`part` as the leading part of zeros of `shape`: the gradient of a src read only there."""
    full = np.zeros(shape, part.dtype)
    leading(full, part.shape)[...] = part
    return full


class IndexPut(Function):
    """y = x with y[index] = v (v broadcast to the indexed part).
    dx = dy with dy[index] = 0 (those entries were overwritten); dv = dy[index], summed
    back to v's shape. (With a repeated index the last write wins, as in numpy.)"""

    def forward(self, x, v, index):
        self.index, self.v_shape = index, v.shape
        y = x.copy()
        view, rest = indexed(y, index)
        view[rest] = v
        return y

    def backward(self, grad):
        dx = grad.copy()
        view, rest = indexed(dx, self.index)
        view[rest] = 0
        grad_view, _ = indexed(grad, self.index)
        return dx, unbroadcast(grad_view[rest], self.v_shape)


class Gather(Function):
    """y[p] = x[along(index)[p]].  dx = dy added back at the gathered places (np.add.at:
    an element gathered twice gets both gradients)."""

    def forward(self, x, index, dim):
        self.shape, self.where = x.shape, along(index, dim)
        return x[self.where]

    def backward(self, grad):
        dx = np.zeros(self.shape, grad.dtype)
        np.add.at(dx, self.where, grad)
        return dx


class Scatter(Function):
    """y = x, then y[along(index)[p]] = src[p].  dx = dy, 0 where overwritten; dsrc[p] =
    dy[along(index)[p]] on the leading index-shaped part of src, 0 elsewhere."""

    def forward(self, x, src, index, dim):
        self.src_shape, self.where = src.shape, along(index, dim)
        y = x.copy()
        y[self.where] = leading(src, index.shape)
        return y

    def backward(self, grad):
        dx = grad.copy()
        dx[self.where] = 0
        return dx, self.src_gradient(grad)

    def src_gradient(self, grad):
        return padded(grad[self.where], self.src_shape)


class ScatterAdd(Scatter):
    """y = x, then y[along(index)[p]] += src[p] (repeats add up).  dx = dy; dsrc[p] =
    dy[along(index)[p]]."""

    def forward(self, x, src, index, dim):
        self.src_shape, self.where = src.shape, along(index, dim)
        y = x.copy()
        np.add.at(y, self.where, leading(src, index.shape))
        return y

    def backward(self, grad):
        return grad, self.src_gradient(grad)


def _raw_index(index):
    return index.data if isinstance(index, Tensor) else index


def setitem(a, index, value):
    """`a[index] = value`, as PyTorch's in-place assignment, made differentiable: `a` becomes
    the output of an IndexPut of its old value (gradients reach both it and `value`).
    A mask index is masked assignment (`a[a > 0] = 0`). The array is replaced, not written
    into, so what backward saved of the old value stays intact."""
    if a.is_leaf and a.requires_grad and is_grad_enabled():
        raise RuntimeError("a leaf tensor that requires grad cannot be assigned into (y[idx] = v); "
                           "assign into a clone, or inside mt.no_grad()")
    index = tuple(_raw_index(i) for i in index) if isinstance(index, tuple) else _raw_index(index)
    value = ops.cast(value, a.dtype) if isinstance(value, Tensor) else Tensor(np.asarray(value).astype(a.dtype))
    old = Tensor(a.data, requires_grad=a.requires_grad)
    old._place = a._place  # the old value keeps a's place in the graph; a takes the new one
    autograd.rebound(old, a)  # a trace reads a's node as old, and a as the IndexPut from here on
    new = IndexPut.apply(old, value, index=index)
    a.data, a._place, a.requires_grad = new.data, new._place, new.requires_grad
    autograd.rebound(a, new)


def index_tensor(op, a, dim, index):
    """`index` (any integer dtype: int32 too, as PyTorch 2 accepts) as an int64 array with
    a's number of dims, `dim` checked, entries in range."""
    index = np.asarray(_raw_index(index))
    if index.dtype.kind not in "iu":
        raise DTypeError(f"{op}: index must be an integer tensor (mt.int64 or mt.int32), got {index.dtype}")
    index = index.astype(np.int64, copy=False)
    dim = check_dim(op, dim, a.ndim or 1, a.shape)
    if index.ndim != a.ndim:
        raise ShapeError(f"{op}: index {index.shape} and input {a.shape} need the same number of dims")
    if index.size and not (0 <= index.min() and index.max() < a.shape[dim]):
        raise IndexRangeError(f"{op}: index [{index.min()}, {index.max()}] is out of range [0, {a.shape[dim]}) "
                         f"for dim {dim} of {a.shape}")
    return index, dim


def check_fits(op, index, shapes, dim):
    """gather/scatter's rule: index no larger than each shape in every dim but `dim`."""
    for shape in shapes:
        if any(i > n for d, (i, n) in enumerate(zip(index.shape, shape)) if d != dim):
            raise ShapeError(f"{op}: index {index.shape} is larger than {shape} outside dim {dim}")


def gather(a, dim, index):
    """`out[i][j] = a[index[i][j]][j]` for dim 0 (and alike for any dim), as `torch.gather`."""
    index, dim = index_tensor("gather", a, dim, index)
    check_fits("gather", index, [a.shape], dim)
    return Gather.apply(a, index=index, dim=dim)


def _scatter(op, cls, a, dim, index, src):
    index, dim = index_tensor(op, a, dim, index)
    src = src if isinstance(src, Tensor) else Tensor(np.full(index.shape, src, a.dtype))
    if src.dtype != a.dtype:
        raise dtype_mismatch(op, a, src)
    if src.ndim != a.ndim:
        raise ShapeError(f"{op}: src {src.shape} and input {a.shape} need the same number of dims")
    check_fits(op, index, [a.shape], dim)
    check_fits(op, index, [src.shape], -1)  # src must hold index's shape in every dim
    return cls.apply(a, src, index=index, dim=dim)


def scatter(a, dim, index, src=None, *, value=None):
    """A copy of `a` with `out[index[i][j]][j] = src[i][j]` (dim 0); `src` may be a number,
    or give `value=`, as `torch.scatter`."""
    return _scatter("scatter", Scatter, a, dim, index, value if src is None else src)


def scatter_add(a, dim, index, src):
    """A copy of `a` with `out[index[i][j]][j] += src[i][j]` (dim 0); repeated indices add up."""
    return _scatter("scatter_add", ScatterAdd, a, dim, index, src)


def index_select(a, dim, index):
    """The entries `index` (a 1-d int tensor) of `a` along `dim`; the gradient adds back."""
    index = np.asarray(_raw_index(index))
    if index.ndim > 1 or index.dtype.kind not in "iu":
        raise ValueError(f"index_select: index must be a 0-d or 1-d integer tensor, got {index.dtype} {index.shape}")
    dim = check_dim("index_select", dim, a.ndim or 1, a.shape)
    length = a.shape[dim] if a.ndim else 1
    if index.size and not (0 <= index.min() and index.max() < length):  # PyTorch refuses −1 too, as gather does
        raise IndexError(f"index_select: index [{index.min()}, {index.max()}] is out of range [0, {length}) "
                         f"for dim {dim} of {a.shape}")
    return a[(slice(None),) * dim + (index.reshape(-1),)] if a.ndim else a.reshape(1)[index.reshape(-1)]


def masked_select(a, mask):
    """The 1-d tensor of a's entries where `mask` (broadcast with a) is True."""
    mask = np.asarray(_raw_index(mask))
    if mask.dtype != np.bool_:
        raise TypeError(f"masked_select: mask must be bool, got {mask.dtype}")
    shape = np.broadcast_shapes(a.shape, mask.shape)
    return expand(a, shape)[np.broadcast_to(mask, shape)]


def one_hot(tensor, num_classes=-1):
    """int64 `(..., num_classes)`: 1 at each entry's class, 0 elsewhere (no gradient).
    num_classes −1 means max + 1, as in PyTorch."""
    labels = np.asarray(_raw_index(tensor))
    if labels.dtype != np.int64:
        raise TypeError(f"one_hot: needs an int64 tensor of class indices, got {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"one_hot: class values must be non-negative, got {labels.min()}")
    if num_classes == -1:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"one_hot: class values must be smaller than num_classes {num_classes}, got {labels.max()}")
    classes = np.arange(num_classes)
    return comparison.discrete(lambda x: (x[..., None] == classes).astype(np.int64), Tensor(labels))
