"""`scatter_reduce`: scatter with a reduction, `torch.scatter_reduce(x, dim, index, src,
reduce, include_self=True)`, reduce one of "sum", "prod", "mean", "amax", "amin".

Every position q of the output reduces its CONTRIBUTORS: x[q] itself (unless
include_self=False and some src entry lands on q) and each src[p] with along(index)[p] = q
(minitensor.indexing.along). A position no entry lands on keeps x[q]. The gradients are
PyTorch's:
    sum    each contributor gets dy[q]
    mean   each gets dy[q] / n[q], n[q] the number of contributors
    prod   each gets dy[q] · (the product of the OTHER contributors), exact with zeros
    amax   (amin) the contributors equal to y[q] share dy[q] evenly; the others get 0
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.errors import ShapeError
from minitensor.indexing import along, check_fits, index_tensor, leading, padded
from minitensor.operands import dtype_mismatch
from minitensor.tensor import Tensor

REDUCES = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}


def _identity(reduce, dtype):
    """The value a position starts from when x itself does not contribute."""
    if reduce in ("amax", "amin"):
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
        big = np.inf if dtype.kind == "f" else info.max
        return -big if reduce == "amax" else big
    return 1 if reduce == "prod" else 0


class ScatterReduce(Function):
    """y[q] = reduce(contributors of q) (module docstring); the backward gives each
    contributor its share of dy[q] by the rule of its reduction."""

    def forward(self, x, src, index, dim, reduce, include_self):
        where, self.src_shape, src = along(index, dim), src.shape, leading(src, index.shape)
        hits = np.zeros(x.shape, np.int64)
        np.add.at(hits, where, 1)
        self_counts = include_self | (hits == 0)  # does x[q] contribute?
        y = np.where(self_counts, x, np.asarray(_identity(reduce, x.dtype), x.dtype))
        REDUCES[reduce].at(y, where, src)
        n = np.maximum(hits + self_counts, 1).astype(x.dtype)  # contributors (≥ 1: a NaN-free divisor)
        if reduce == "mean":
            y = y // n if x.dtype.kind in "iu" else y / n  # integers: floor, as PyTorch
        self.save_for_backward(x, src, y, n, self_counts)
        self.where, self.reduce = where, reduce
        return y

    def backward(self, grad):
        x, src, y, n, self_counts = self.saved
        if self.reduce in ("sum", "mean"):
            share = grad / n if self.reduce == "mean" else grad
            dx, dsrc = share * self_counts, share[self.where]
        elif self.reduce == "prod":
            dx, dsrc = self._product_of_others(grad, x, src, y, self_counts)
        else:
            ties = self_counts & (x == y)
            src_ties = src == y[self.where]
            count = ties.astype(grad.dtype)
            np.add.at(count, self.where, src_ties)
            share = grad / np.maximum(count, 1)
            dx, dsrc = share * ties, share[self.where] * src_ties
        return dx, padded(dsrc, self.src_shape)  # src beyond the index's shape is not read

    def _product_of_others(self, grad, x, src, y, self_counts):
        """Π of the other contributors: y / v for a factor v ≠ 0; for v = 0, the product of
        the nonzero factors if v is the only zero, else 0."""
        zeros = (self_counts & (x == 0)).astype(np.int64)
        np.add.at(zeros, self.where, src == 0)
        nonzero = np.where(self_counts & (x != 0), x, np.ones((), x.dtype))
        np.multiply.at(nonzero, self.where, np.where(src == 0, np.ones((), src.dtype), src))
        with np.errstate(divide="ignore", invalid="ignore"):
            dx = np.where(x != 0, y / x, np.where(zeros == 1, nonzero, 0)) * grad * self_counts
            at = self.where
            dsrc = np.where(src != 0, y[at] / src, np.where(zeros[at] == 1, nonzero[at], 0)) * grad[at]
        return dx, dsrc


def scatter_reduce(a, dim, index, src, reduce, *, include_self=True):
    """A copy of `a` where each src entry is reduced into `out[index[i][j]][j]` (dim 0) by
    `reduce`: "sum", "prod", "mean", "amax" or "amin", as `torch.scatter_reduce`."""
    if reduce not in REDUCES:
        raise ValueError(f"scatter_reduce: reduce must be one of {list(REDUCES)}, got {reduce!r}")
    index, dim = index_tensor("scatter_reduce", a, dim, index)
    src = src if isinstance(src, Tensor) else Tensor(src)
    if src.dtype != a.dtype:
        raise dtype_mismatch("scatter_reduce", a, src)
    if src.ndim != a.ndim:
        raise ShapeError(f"scatter_reduce: src {src.shape} and input {a.shape} need the same number of dims")
    check_fits("scatter_reduce", index, [a.shape], dim)
    check_fits("scatter_reduce", index, [src.shape], -1)
    return ScatterReduce.apply(a, src, index=index, dim=dim, reduce=reduce, include_self=bool(include_self))
