"""Embedding: a row lookup whose gradient adds each use of a row back into it."""
import numpy as np

from minitensor import dtypes
from minitensor.autograd import Function
from minitensor.nn.checks import index_array


class Embedding(Function):
    """Row lookup `weight[idx]`; the gradient of a row adds up over its uses."""

    def forward(self, weight, idx):
        self.idx, self.shape = idx, weight.shape
        return weight[idx]

    def backward(self, grad):
        # Scatter-add into the flattened table: element (i, j) of row idx[i] sits at
        # idx[i]·dim + j. numpy's add.at is fast on 1-D indices, slow on row indices.
        dim = self.shape[1]
        flat = (self.idx.reshape(-1, 1) * dim + np.arange(dim)).reshape(-1)
        dw = np.zeros(self.shape[0] * dim, dtypes.accumulate_dtype(grad.dtype))  # a sum: float32 for 16-bit
        np.add.at(dw, flat, grad.reshape(-1))
        return dtypes.like(grad.dtype, dw.reshape(self.shape))


def embedding(idx, weight):
    idx = index_array(idx)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"embedding: indices range [{idx.min()}, {idx.max()}] outside [0, {weight.shape[0]})")
    return Embedding.apply(weight, idx=idx)
