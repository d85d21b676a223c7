"""minitensor: a small, readable autograd engine on numpy tensors.

    import minitensor as mt
    x = mt.tensor([[1.0, 2.0]], requires_grad=True)
    (x * x).sum().backward()      # x.grad == 2x
    layer = mt.nn.Linear(2, 3)    # mt.nn, mt.nn.functional and mt.optim need no further import

Every op also has PyTorch's name at the top (`mt.sin(x)`, `mt.argmax(x, 1)`); the README's
table lists them.
"""

import numpy as np

from minitensor import dtypes, nn, optim
from minitensor.activations import (
    clamp,
    clip,
    elu,
    hardsigmoid,
    hardtanh,
    leaky_relu,
    logsigmoid,
    maximum,
    minimum,
    relu6,
    sigmoid,
    silu,
    softplus,
)
from minitensor.autograd import Function, enable_grad, is_grad_enabled, no_grad
from minitensor.binary_math import copysign, floor_divide, fmod, remainder
from minitensor.comparison import (
    allclose,
    bitwise_and,
    bitwise_left_shift,
    bitwise_not,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    eq,
    equal,
    ge,
    gt,
    isclose,
    isfinite,
    isinf,
    isnan,
    le,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    lt,
    ne,
)
from minitensor.creation import (
    arange,
    empty,
    empty_like,
    eye,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    zeros,
    zeros_like,
)
from minitensor.einsum import einsum
from minitensor.gradcheck import gradcheck
from minitensor.indexing import gather, index_select, masked_select, scatter, scatter_add
from minitensor.math_ops import (
    abs,
    acos,
    asin,
    atan,
    ceil,
    cos,
    cosh,
    erf,
    exp2,
    expm1,
    floor,
    log1p,
    log2,
    log10,
    reciprocal,
    round,
    rsqrt,
    sign,
    sin,
    sinh,
    square,
    tan,
    trunc,
)
from minitensor.nn.functional import log_softmax, softmax
from minitensor.ops import add, div, masked_fill, matmul, mul, pow, sub, where
from minitensor.promotion import promote_types
from minitensor.random import default_generator, get_rng_state, manual_seed, set_rng_state
from minitensor.rearrange import chunk, clone, flip, roll, tril, triu, unflatten
from minitensor.recompute import recompute
from minitensor.reductions import all, amax, amin, any, argmax, argmin, dot, max, mean, min, prod, sum
from minitensor.scans import cummax, cummin, cumprod, cumsum
from minitensor.scatter_reduction import scatter_reduce
from minitensor.shape_ops import cat, concat, split, stack
from minitensor.sorting import argsort, sort, topk
from minitensor.statistics import logsumexp, std, var
from minitensor.tensor import Tensor, float16, float32, float64, int64, tensor
from minitensor.unary_ops import exp, log, relu, sqrt, tanh

# PyTorch's other dtype names (numpy's dtypes, as float32 is)
int8, int16, int32, uint8, bool = np.int8, np.int16, np.int32, np.uint8, np.bool_
half, double, long = float16, float64, int64

from minitensor import methods  # noqa: E402, F401  (installs Tensor's named methods, once every op module is loaded)

__all__ = [
    "Function", "Tensor", "tensor", "zeros", "ones", "randn", "arange", "float32", "float64", "int64",
    "no_grad", "enable_grad", "is_grad_enabled",
    "exp", "log", "sqrt", "tanh", "relu", "matmul", "dot", "where", "masked_fill",
    "concat", "split", "stack", "nn", "optim",
    "recompute", "manual_seed", "default_generator", "get_rng_state", "set_rng_state", "gradcheck",
    # the PyTorch surface (README: the op table)
    "full", "empty", "eye", "linspace", "rand", "randint", "zeros_like", "ones_like", "empty_like", "full_like",
    "rand_like", "randn_like", "float16", "bfloat16", "int8", "int16", "int32", "uint8", "bool", "half", "double",
    "long", "cat", "promote_types", "add", "sub", "mul", "div", "pow",
    "sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "any", "all", "dot", "var", "std",
    "logsumexp", "cumsum", "cumprod",
    "abs", "sign", "floor", "ceil", "round", "trunc", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "exp2", "log2", "log10", "log1p", "expm1", "rsqrt", "reciprocal", "square", "erf",
    "sigmoid", "logsigmoid", "silu", "leaky_relu", "elu", "softplus", "relu6", "hardtanh", "clamp", "clip",
    "maximum", "minimum",
    "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "isnan", "isinf", "isfinite", "isclose", "allclose", "equal",
    "chunk", "clone", "flip", "roll", "tril", "triu", "unflatten", "gather", "scatter", "scatter_add",
    "index_select", "masked_select", "sort", "argsort", "topk", "softmax", "log_softmax",
    "einsum", "copysign", "floor_divide", "remainder", "fmod", "bitwise_left_shift", "bitwise_right_shift", "cummax", "cummin", "scatter_reduce", "hardsigmoid",
]


def __getattr__(name):
    """`mt.bfloat16` (None without ml_dtypes), imported on first use (minitensor.dtypes)."""
    if name == "bfloat16":
        return dtypes.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
