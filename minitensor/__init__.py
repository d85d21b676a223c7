"""minitensor: a small, readable autograd engine on numpy tensors.

    import minitensor as mt
    x = mt.tensor([[1.0, 2.0]], requires_grad=True)
    (x * x).sum().backward()      # x.grad == 2x
    layer = mt.nn.Linear(2, 3)    # mt.nn, mt.nn.functional and mt.optim need no further import
"""
from minitensor import nn, optim
from minitensor.autograd import Function, enable_grad, is_grad_enabled, no_grad
from minitensor.checkpoint import checkpoint
from minitensor.creation import arange, ones, randn, zeros
from minitensor.gradcheck import gradcheck
from minitensor.ops import masked_fill, matmul, where
from minitensor.random import default_generator, get_rng_state, manual_seed, set_rng_state
from minitensor.shape_ops import concat, split, stack
from minitensor.tensor import Tensor, float32, float64, int64, tensor
from minitensor.unary_ops import exp, log, relu, sqrt, tanh

__all__ = [
    "Function", "Tensor", "tensor", "zeros", "ones", "randn", "arange", "float32", "float64", "int64",
    "no_grad", "enable_grad", "is_grad_enabled",
    "exp", "log", "sqrt", "tanh", "relu", "matmul", "where", "masked_fill",
    "concat", "split", "stack", "nn", "optim",
    "checkpoint", "manual_seed", "default_generator", "get_rng_state", "set_rng_state", "gradcheck",
]
