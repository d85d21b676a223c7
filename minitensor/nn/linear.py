"""The Linear Function: y = x Wᵀ + b as one GEMM, its three products as methods (F.linear
applies it; the FP8 Linear, minitensor.fp8.linear, replaces only the products)."""
from minitensor import dtypes
from minitensor.autograd import Function


class Linear(Function):
    """y = x Wᵀ + b over the last axis, as one GEMM on x reshaped to 2-D. Its three products
    are methods, so the FP8 Linear (minitensor.fp8.linear) changes only them."""

    def forward(self, x, weight, bias=None):
        x2 = x.reshape(-1, x.shape[-1])
        self.x_shape, self.has_bias = x.shape, bias is not None
        y = self.product(x2, weight)
        if bias is not None:
            y += bias
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def product(self, x2, weight):
        """x Wᵀ of the 2-D input, keeping what the gradients' products need."""
        self.save_for_backward(x2, weight)
        return dtypes.matmul(x2, weight.T)

    def input_grad(self, g2):
        return dtypes.matmul(g2, self.saved[1])  # dx = dy W

    def weight_grad(self, g2):
        return dtypes.matmul(g2.T, self.saved[0])  # dW = dyᵀ x

    def backward(self, grad):
        return self.backward_parts(grad, (True, True, self.has_bias))

    def backward_parts(self, grad, wanted):
        """The gradients flagged in `wanted` (x, weight[, bias]), None for the others: a split
        backward asks for dx now and for dW, db later (minitensor.split_backward)."""
        g2 = grad.reshape(-1, grad.shape[-1])
        dx = self.input_grad(g2).reshape(self.x_shape) if wanted[0] else None
        dw = self.weight_grad(g2) if wanted[1] else None
        if not self.has_bias:
            return dx, dw
        return dx, dw, (dtypes.sum(g2, axis=0) if wanted[2] else None)
