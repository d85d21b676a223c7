"""The layers a GPT needs, with PyTorch's parameter shapes, names and default inits."""
import math

import numpy as np

from minitensor.nn import functional as F
from minitensor.nn.module import Module, Parameter
from minitensor.random import normal, uniform
from minitensor.tensor import DEFAULT_FLOAT


def check_sizes(layer, **sizes):
    """Every size must be a positive int; the message names the layer, the argument and its value."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}")


class Linear(Module):
    """y = x Wᵀ + b, weight (out, in). Init as PyTorch: U(±1/√in) for weight and bias.

    The input must have the layer's dtype: make float64 numpy data float32 with
    `mt.tensor(x, dtype=mt.float32)` (or the layer float64 with `.double()`).
    """

    def __init__(self, in_features, out_features, bias=True, dtype=DEFAULT_FLOAT):
        check_sizes("Linear", in_features=in_features, out_features=out_features)
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features)
        self.weight = Parameter(uniform((out_features, in_features), bound, dtype))
        self.bias = Parameter(uniform((out_features,), bound, dtype)) if bias else None
        self.fp8 = None  # an FP8 recipe's scaling state (minitensor.fp8), set by an FP8 precision policy
        self.routed = False  # a routed expert's (minitensor.nn.moe.Expert): its rows come in the layout's order

    def forward(self, x):
        return F.linear(x, self.weight, self.bias, fp8=self.fp8)


class Embedding(Module):
    """A table of `num_embeddings` rows of size `embedding_dim`, init N(0, 1)."""

    def __init__(self, num_embeddings, embedding_dim, dtype=DEFAULT_FLOAT):
        check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        super().__init__()
        self.weight = Parameter(normal((num_embeddings, embedding_dim), 1.0, dtype))

    def forward(self, idx):
        return F.embedding(idx, self.weight)


class LayerNorm(Module):
    """Normalizes over the last axis; `normalized_shape` is its size (an int or a 1-tuple)."""

    def __init__(self, normalized_shape, eps=1e-5, dtype=DEFAULT_FLOAT):
        if isinstance(normalized_shape, (tuple, list)) and len(normalized_shape) == 1:
            normalized_shape = normalized_shape[0]
        check_sizes("LayerNorm", normalized_shape=normalized_shape)
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(normalized_shape, dtype))
        self.bias = Parameter(np.zeros(normalized_shape, dtype))

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Active only in training mode; masks come from `generator` (default: thread's seeded one)."""

    def __init__(self, p=0.5, generator=None):
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.generator)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)
