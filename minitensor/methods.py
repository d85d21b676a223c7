"""Tensor's named methods, with PyTorch's names: each is the op function itself.

A function whose first argument is the tensor is a method as it stands (`x.sum(1)` calls
`reductions.sum(x, 1)`), so this table is the whole of Tensor's op surface: its operators
(tensor.py) call these methods (`x + y` is `x.add(y)`), so tensor.py imports no op module.
The op's docstring is the method's. The README lists them with the PyTorch name of each.
"""
import numpy as np

from minitensor import (
    activations,
    binary_math,
    comparison,
    indexing,
    inplace,
    math_ops,
    ops,
    rearrange,
    reductions,
    scans,
    scatter_reduction,
    shape_ops,
    sorting,
    statistics,
    unary_ops,
)
from minitensor.nn import functional
from minitensor.tensor import Tensor

METHODS = {
    ops: ["add", "sub", "mul", "div", "pow", "neg", "matmul", "masked_fill"],
    reductions: ["sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "any", "all", "dot"],
    statistics: ["var", "std", "logsumexp"],
    scans: ["cumsum", "cumprod", "cummax", "cummin"],
    binary_math: ["copysign", "floor_divide", "remainder", "fmod"],
    unary_ops: ["exp", "log", "sqrt", "tanh", "relu", "gelu"],
    math_ops: ["abs", "sign", "floor", "ceil", "round", "trunc", "sin", "cos", "tan", "asin", "acos", "atan",
               "sinh", "cosh", "exp2", "log2", "log10", "log1p", "expm1", "rsqrt", "reciprocal", "square", "erf"],
    activations: ["sigmoid", "clamp", "clip", "maximum", "minimum"],
    comparison: ["lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_xor", "logical_not",
                 "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
                 "bitwise_right_shift", "isnan", "isinf", "isfinite",
                 "isclose", "allclose", "equal"],
    shape_ops: ["reshape", "flatten", "unsqueeze", "squeeze", "transpose", "t", "permute", "swapaxes", "split"],
    rearrange: ["expand", "expand_as", "repeat", "tril", "triu", "flip", "roll", "clone", "contiguous", "chunk",
                "unflatten"],
    indexing: ["gather", "scatter", "scatter_add", "index_select", "masked_select"],
    scatter_reduction: ["scatter_reduce"],
    sorting: ["sort", "argsort", "topk"],
    functional: ["softmax", "log_softmax"],
}
ALIASES = {"view": shape_ops.reshape, "multiply": ops.mul, "divide": ops.div, "subtract": ops.sub,
           "absolute": math_ops.abs, "arcsin": math_ops.asin, "arccos": math_ops.acos, "arctan": math_ops.atan,
           "greater": comparison.gt, "less": comparison.lt,
           "astype": ops.cast, "__getitem__": shape_ops.getitem,  # y[idx]: a GetItem (minitensor.shape_ops)
           "__setitem__": indexing.setitem,  # y[idx] = v: an IndexPut (minitensor.indexing)
           "__floordiv__": binary_math.floor_divide,
           "__rfloordiv__": lambda self, other: binary_math.floor_divide(other, self),
           "__mod__": binary_math.remainder, "__rmod__": lambda self, other: binary_math.remainder(other, self),
           "__lshift__": comparison.bitwise_left_shift, "__rshift__": comparison.bitwise_right_shift,
           "__rlshift__": lambda self, other: comparison.bitwise_left_shift(other, self),
           "__rrshift__": lambda self, other: comparison.bitwise_right_shift(other, self),
           **inplace.operators(ops.add, ops.sub, ops.mul, ops.div)}  # x += y, ... (minitensor.inplace)


def _cast_to(dtype):
    def cast(self):
        return self.to(dtype)
    cast.__doc__ = f"This tensor as {np.dtype(dtype)} (itself if it is already)."
    return cast


CASTS = {"float": np.float32, "double": np.float64, "half": np.float16, "long": np.int64, "int": np.int32,
         "short": np.int16, "char": np.int8, "byte": np.uint8, "bool": np.bool_}

for module, names in METHODS.items():
    for name in names:
        setattr(Tensor, name, getattr(module, name))
for name, function in ALIASES.items():
    setattr(Tensor, name, function)
for name, dtype in CASTS.items():
    setattr(Tensor, name, _cast_to(dtype))
