"""The two row-moving ops of a mixture of experts, each an autograd Function: gather rows
by index (dispatch: tokens to their experts' order) and add rows into places by index
(combine: expert outputs back to their tokens). Each is the other's backward.

    gather_rows(x, index)          y[j] = x[index[j]]                dx[i] = Σ_{j: index[j] = i} dy[j]
    scatter_add_rows(y, index, n)  x[i] = Σ_{j: index[j] = i} y[j]  dy[j] = dx[index[j]]

And one for a pipeline stage that ends before the loss: `with_aux_loss(x, aux, scale)`
passes x on unchanged, and its backward also gives the stage's auxiliary loss the gradient
`scale` = d(total loss)/d(aux) (Megatron-Core's MoEAuxLossAutoScaler), so the balancing
loss of an early stage's MoE layers joins the backward that starts at the last stage.
"""
import numpy as np

from minitensor.autograd import Function


class GatherRows(Function):
    def forward(self, x, index):
        self.index, self.rows = index, x.shape[0]
        return x[index]

    def backward(self, grad):
        return scatter_add(grad, self.index, self.rows)


class ScatterAddRows(Function):
    def forward(self, y, index, rows):
        self.index = index
        return scatter_add(y, index, rows)

    def backward(self, grad):
        return grad[self.index]


def scatter_add(y, index, rows):
    """numpy: an array of `rows` rows (zeros) with each y[j] added into row index[j]."""
    out = np.zeros((rows,) + y.shape[1:], y.dtype)
    np.add.at(out, index, y)
    return out


def gather_rows(x, index):
    """x[index] along the first axis (index: an integer numpy array), differentiable."""
    return GatherRows.apply(x, index=np.asarray(index, dtype=np.int64))


def scatter_add_rows(y, index, rows):
    """`rows` rows of zeros with each row y[j] added into row index[j], differentiable."""
    return ScatterAddRows.apply(y, index=np.asarray(index, dtype=np.int64), rows=int(rows))


class WithAuxLoss(Function):
    def forward(self, x, aux, scale):
        self.aux_like, self.scale = np.zeros_like(aux), scale
        return x

    def backward(self, grad):
        return grad, self.aux_like + self.scale


def with_aux_loss(x, aux, scale):
    """x unchanged; backward through it also runs from the scalar Tensor `aux` with gradient `scale`."""
    return WithAuxLoss.apply(x, aux, scale=float(scale))
