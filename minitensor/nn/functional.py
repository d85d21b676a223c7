"""Fused, numerically stable ops: each reads like the math, with its derivative beside it."""
import math

import numpy as np

from minitensor import unary_ops
from minitensor.autograd import Function
from minitensor.random import default_generator
from minitensor.tensor import Tensor


class Linear(Function):
    """y = x Wᵀ + b over the last axis, as one GEMM on x reshaped to 2-D."""

    def forward(self, x, weight, bias=None):
        x2 = x.reshape(-1, x.shape[-1])
        self.save_for_backward(x2, weight)
        self.x_shape, self.has_bias = x.shape, bias is not None
        y = x2 @ weight.T
        if bias is not None:
            y += bias
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def backward(self, grad):
        x2, weight = self.saved
        g2 = grad.reshape(-1, grad.shape[-1])
        grads = ((g2 @ weight).reshape(self.x_shape), g2.T @ x2)  # dx = dy W, dW = dyᵀ x
        return grads + (g2.sum(axis=0),) if self.has_bias else grads


class Softmax(Function):
    """y = softmax(s·x) over `axis`, with the entries where `mask` is True left out (y = 0).

    y = exp(s·x − max) / Σ exp(s·x − max).  dx = s · y ⊙ (dy − Σ dy⊙y).
    Attention passes its 1/√d scale and causal mask here, so scaling, masking and
    normalizing happen in place in one buffer instead of three ops with three copies.
    """

    def forward(self, x, axis, scale=1.0, mask=None):
        self.axis, self.scale = axis, scale
        y = x * scale
        if mask is not None:
            np.copyto(y, -np.inf, where=mask)  # exp(−∞) = 0: masked entries get no weight
        y -= y.max(axis=axis, keepdims=True)
        np.exp(y, out=y)
        y /= y.sum(axis=axis, keepdims=True)
        self.y = y
        return y

    def backward(self, grad):
        # exercise 02.3: softmax backward
        # hint: with the saved output y: dx = s · y ⊙ (dy − Σ dy⊙y), the sum over self.axis kept as an axis.
        y = self.y
        dx = grad - np.expand_dims(np.vecdot(grad, y, axis=self.axis), self.axis)
        dx *= y
        dx *= self.scale
        return dx
        # end exercise


def _log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted


class LogSoftmax(Function):
    """y = x − logsumexp(x).  dx = dy − softmax(x)·Σ dy."""

    def forward(self, x, axis):
        self.axis = axis
        self.y = _log_softmax(x, axis)
        return self.y

    def backward(self, grad):
        return grad - np.exp(self.y) * grad.sum(axis=self.axis, keepdims=True)


class LayerNorm(Function):
    """y = x̂·w + b with x̂ = (x − μ)/σ over the last axis.

    With g = dy·w: dx = (g − mean(g) − x̂·mean(g·x̂)) / σ; dw = Σ dy·x̂; db = Σ dy.
    """

    def forward(self, x, weight, bias, eps):
        n = x.shape[-1]
        xhat = x - x.mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.vecdot(xhat, xhat)[..., None] / n + eps)  # variance as a row dot product
        xhat *= rstd
        self.save_for_backward(xhat, rstd, weight)
        y = xhat * weight
        y += bias
        return y

    def backward(self, grad):
        # exercise 02.1: LayerNorm backward
        # hint: use the saved x̂, 1/σ and w: with g = dy·w, dx = (g − mean(g) − x̂·mean(g·x̂)) / σ,
        # hint: dw = Σ dy·x̂ and db = Σ dy over every axis but the last.
        xhat, rstd, weight = self.saved
        n, lead = grad.shape[-1], tuple(range(grad.ndim - 1))
        grad_xhat = grad * xhat
        dw, db = grad_xhat.sum(axis=lead), grad.sum(axis=lead)
        # mean(g) = (dy·w)/n and mean(g·x̂) = ((dy⊙x̂)·w)/n: matrix-vector products, no temporaries
        mean_g = (grad @ weight)[..., None] / n
        mean_gx = (grad_xhat @ weight)[..., None] / n
        dx = grad * weight
        dx -= mean_g
        dx -= np.multiply(xhat, mean_gx, out=grad_xhat)  # reuse the dy⊙x̂ buffer
        dx *= rstd
        return dx, dw, db
        # end exercise


class CrossEntropy(Function):
    """Mean over counted tokens of −log softmax(logits)[target].

    d/dlogits = (softmax − onehot(target)) / n_counted, zero on ignored tokens.
    When every token is ignored the loss is 0 with zero gradient (PyTorch gives NaN):
    a micro-batch without answer tokens then adds nothing instead of poisoning the sum.
    """

    def forward(self, logits, targets, ignore_index):
        logits2 = logits.reshape(-1, logits.shape[-1])
        targets = targets.reshape(-1)
        counted = targets != ignore_index
        safe = np.where(counted, targets, 0)
        logp = _log_softmax(logits2, axis=-1)
        self.n = max(int(counted.sum()), 1)
        self.save_for_backward(logp, safe, counted)
        self.shape = logits.shape
        picked = logp[np.arange(len(safe)), safe]
        return np.asarray(-(picked * counted).sum() / self.n, dtype=logits.dtype)

    def backward(self, grad):
        # exercise 02.2: cross-entropy backward
        # hint: d/dlogits = (softmax − onehot(target)) / n_counted: softmax is exp(logp);
        # hint: rows of ignored tokens get zero; scale by the incoming grad; return the logits' shape.
        logp, safe, counted = self.saved
        d = np.exp(logp)
        d[np.arange(len(safe)), safe] -= 1
        d *= (counted * (grad / self.n))[:, None]
        return d.reshape(self.shape)
        # end exercise


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
        dw = np.zeros(self.shape[0] * dim, grad.dtype)
        np.add.at(dw, flat, grad.reshape(-1))
        return dw.reshape(self.shape)


def _check_same_dtype(op, *tensors):
    dtypes = [t.dtype for t in tensors]
    if len(set(dtypes)) > 1:
        raise TypeError(f"{op}: dtypes {[str(d) for d in dtypes]} differ; convert one explicitly")


def linear(x, weight, bias=None):
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {x.shape} does not fit weight {weight.shape} (need last dim {weight.shape[1]})")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear: bias {bias.shape} does not fit weight {weight.shape} (need {weight.shape[:1]})")
    _check_same_dtype("linear", x, weight, *([bias] if bias is not None else []))
    return Linear.apply(x, weight, bias) if bias is not None else Linear.apply(x, weight)


def softmax(x, axis=-1):
    return Softmax.apply(x, axis=axis)


def log_softmax(x, axis=-1):
    return LogSoftmax.apply(x, axis=axis)


def layer_norm(x, weight, bias, eps=1e-5):
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"layer_norm: input {x.shape} needs weight and bias of shape {x.shape[-1:]}, "
                         f"got {weight.shape} and {bias.shape}")
    _check_same_dtype("layer_norm", x, weight, bias)
    return LayerNorm.apply(x, weight, bias, eps=eps)


def _index_array(idx):
    idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
    return idx


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean cross-entropy of `logits (..., V)` against integer `targets (...)`."""
    targets = _index_array(targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {logits.shape} need targets of shape {logits.shape[:-1]}, "
                         f"got {targets.shape}")
    return CrossEntropy.apply(logits, targets=targets, ignore_index=ignore_index)


def embedding(idx, weight):
    idx = _index_array(idx)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"embedding: indices range [{idx.min()}, {idx.max()}] outside [0, {weight.shape[0]})")
    return Embedding.apply(weight, idx=idx)


def dropout(x, p=0.5, training=True, generator=None):
    """Zero each element with probability p and scale the rest by 1/(1−p).

    The mask comes from `generator` (default: this thread's seeded generator), so a
    run is deterministic for a given seed.
    """
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    rng = generator if generator is not None else default_generator()
    keep = rng.random(x.shape) >= p
    return x * Tensor((keep / (1.0 - p)).astype(x.dtype))


def _causal_mask(t_q, t_k):
    """True above the diagonal: query i may not look at keys after position i
    (aligned top-left, as PyTorch's `is_causal`)."""
    return np.triu(np.ones((t_q, t_k), dtype=bool), k=1)


def scaled_dot_product_attention(q, k, v, causal=False, dropout_p=0.0, training=True, generator=None):
    """softmax(q kᵀ / √d [+ causal mask]) v over the last two axes of (..., T, d) inputs."""
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    mask = _causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    scores = q @ k.swapaxes(-1, -2)
    weights = Softmax.apply(scores, axis=-1, scale=1.0 / math.sqrt(q.shape[-1]), mask=mask)
    weights = dropout(weights, dropout_p, training, generator)
    return weights @ v


def gelu(x):
    return unary_ops.gelu(x)


def relu(x):
    return unary_ops.relu(x)
