"""Fused, numerically stable ops: each reads like the math, with its derivative beside it."""
import math

import numpy as np

from minitensor import dtypes, unary_ops
from minitensor.activations import elu, hardsigmoid, hardtanh, leaky_relu, logsigmoid, relu6, sigmoid, silu, softplus  # noqa: F401  (F.elu ... as in PyTorch)
from minitensor.autograd import Function
from minitensor.indexing import one_hot  # noqa: F401  (F.one_hot, as in PyTorch)
from minitensor.nn.checks import check_class_targets, classes_last, input_in_dtype_of
from minitensor.nn.embedding import embedding  # noqa: F401  (F.embedding)
from minitensor.nn.flash_attention import flash_attention  # noqa: F401  (F.flash_attention)
from minitensor.nn.linear import Linear
from minitensor.nn.losses import binary_cross_entropy, binary_cross_entropy_with_logits, nll_loss, soft_target_loss  # noqa: F401
from minitensor.padding import pad  # noqa: F401  (F.pad, as in PyTorch)
from minitensor.random import default_generator
from minitensor.shape_ops import check_dim, one_dim
from minitensor.tensor import Tensor


class Softmax(Function):
    """y = softmax(s·x) over `axis`, with the entries where `mask` is True left out (y = 0).

    y = exp(s·x − max) / Σ exp(s·x − max).  dx = s · y ⊙ (dy − Σ dy⊙y).
    Attention passes its 1/√d scale and causal mask here, so scaling, masking and
    normalizing happen in place in one buffer instead of three ops with three copies.
    A 16-bit input is computed in float32 and the output rounded once (minitensor.dtypes).
    """

    def forward(self, x, axis, scale=1.0, mask=None):
        self.axis, self.scale = axis, scale
        (x32,) = dtypes.upcast(x)
        y = np.multiply(x32, scale)
        if mask is not None:
            np.copyto(y, -np.inf, where=mask)  # exp(−∞) = 0: masked entries get no weight
        y -= y.max(axis=axis, keepdims=True, initial=-np.inf)  # initial: a 0-size axis gives an empty y, as in PyTorch
        np.exp(y, out=y)
        y /= y.sum(axis=axis, keepdims=True)
        self.y = dtypes.like(x.dtype, y)  # kept as returned: in the input's dtype
        return self.y

    def backward(self, grad):
        grad, y = dtypes.upcast(grad, self.y)  # 16-bit: computed in float32
        # exercise 02.3: softmax backward
        # hint: with y, the saved output: dx = s · y ⊙ (dy − Σ dy⊙y), the sum over self.axis kept as an axis;
        # hint: leave the result in dx.
        dx = grad - np.expand_dims(np.vecdot(grad, y, axis=self.axis), self.axis)
        dx *= y
        dx *= self.scale
        # end exercise
        return dtypes.like(self.y.dtype, dx)


def _log_softmax(x, axis):
    if x.size == 0:  # an empty input (a 0-size axis too): empty, as in PyTorch
        return x.copy()
    shifted = x - x.max(axis=axis, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted


class LogSoftmax(Function):
    """y = x − logsumexp(x).  dx = dy − softmax(x)·Σ dy."""

    def forward(self, x, axis):
        self.axis = axis
        self.y = dtypes.like(x.dtype, _log_softmax(*dtypes.upcast(x), axis))
        return self.y

    def backward(self, grad):
        grad, y = dtypes.upcast(grad, self.y)
        return dtypes.like(self.y.dtype, grad - np.exp(y) * grad.sum(axis=self.axis, keepdims=True))


class LayerNorm(Function):
    """y = x̂·w + b with x̂ = (x − μ)/σ over the last axis.

    With g = dy·w: dx = (g − mean(g) − x̂·mean(g·x̂)) / σ; dw = Σ dy·x̂; db = Σ dy.
    16-bit inputs are computed in float32 (x̂ and 1/σ kept so), results rounded once.
    """

    def forward(self, x, weight, bias, eps):
        self.dtype, n = x.dtype, x.shape[-1]
        x, weight, bias = dtypes.upcast(x, weight, bias)
        xhat = x - x.mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.vecdot(xhat, xhat)[..., None] / n + eps)  # variance as a row dot product
        xhat *= rstd
        self.save_for_backward(xhat, rstd, weight)
        y = xhat * weight
        y += bias
        return dtypes.like(self.dtype, y)

    def backward(self, grad):
        (grad,) = dtypes.upcast(grad)  # 16-bit: computed in float32
        # exercise 02.1: LayerNorm backward
        # hint: use the saved x̂, 1/σ and w: with g = dy·w, dx = (g − mean(g) − x̂·mean(g·x̂)) / σ,
        # hint: dw = Σ dy·x̂ and db = Σ dy over every axis but the last; leave them in dx, dw, db.
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
        # end exercise
        return dtypes.like(self.dtype, dx, dw, db)


class CrossEntropy(Function):
    """Mean over counted tokens of −log softmax(logits)[target].

    d/dlogits = (softmax − onehot(target)) / n_counted, zero on ignored tokens.
    When every token is ignored the loss is 0 with zero gradient (PyTorch gives NaN):
    a micro-batch without answer tokens then adds nothing instead of poisoning the sum.
    16-bit logits are computed in float32 and the loss RETURNED in float32 (a loss scale
    of 2¹⁶ times a loss of 2.5 overflows float16); their gradient is rounded back.
    """

    def forward(self, logits, targets, ignore_index):
        self.dtype = logits.dtype
        (logits,) = dtypes.upcast(logits)
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
        # hint: rows of ignored tokens get zero; scale by the incoming grad; leave it in d, of the logits' shape.
        logp, safe, counted = self.saved
        d = np.exp(logp)
        d[np.arange(len(safe)), safe] -= 1
        d *= (counted * (grad / self.n))[:, None]
        d = d.reshape(self.shape)
        # end exercise
        return dtypes.like(self.dtype, d)


def linear(x, weight, bias=None, fp8=None):
    """y = x Wᵀ + b. `x` may be a numpy array of the weight's dtype; a float64 array for
    float32 weights is an error: convert it with `mt.tensor(x, dtype=mt.float32)`.
    fp8: a layer's FP8 scaling (minitensor.fp8.recipe): the products run on FP8 operands."""
    x = input_in_dtype_of("linear", x, weight, *([bias] if bias is not None else []))
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {x.shape} does not fit weight {weight.shape} (need last dim {weight.shape[1]})")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear: bias {bias.shape} does not fit weight {weight.shape} (need {weight.shape[:1]})")
    if fp8 is not None:
        from minitensor.fp8.linear import Fp8LinearFunction  # the FP8 package loads only when used

        return Fp8LinearFunction.apply(x, weight, *([bias] if bias is not None else []), scaling=fp8)
    return Linear.apply(x, weight, bias) if bias is not None else Linear.apply(x, weight)


def _along_dim(op, cls, x, dim, axis):
    """Softmax or LogSoftmax along `dim` (PyTorch's) or `axis` (numpy's), the last by default."""
    dim = one_dim(op, dim, axis, default=-1)
    check_dim(op, dim, x.ndim or 1, x.shape)
    if x.ndim == 0:  # one element: softmax is 1 (numpy has no axis -1 to normalise over)
        return cls.apply(x.reshape(1), axis=-1).reshape(())
    return cls.apply(x, axis=dim)


def softmax(x, dim=None, *, axis=None):
    """exp(x) / Σ exp(x) along `dim`."""
    return _along_dim("softmax", Softmax, x, dim, axis)


def log_softmax(x, dim=None, *, axis=None):
    """x − logsumexp(x) along `dim`."""
    return _along_dim("log_softmax", LogSoftmax, x, dim, axis)


def layer_norm(x, weight, bias, eps=1e-5):
    x = input_in_dtype_of("layer_norm", x, weight, bias)
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"layer_norm: input {x.shape} needs weight and bias of shape {x.shape[-1:]}, "
                         f"got {weight.shape} and {bias.shape}")
    return LayerNorm.apply(x, weight, bias, eps=eps)


def cross_entropy(logits, targets, ignore_index=-100, *, reduction="mean", label_smoothing=0.0, weight=None):
    """Cross-entropy of `logits (..., C)` (classes LAST) against integer `targets (...)` in
    [0, C), or against probabilities of the logits' shape (float targets, classes last).
    Integer targets (N, d1, ...) for logits (N, C, d1, ...) read PyTorch's layout (classes
    in dim 1; nn.checks.classes_last). `weight` (one per class, a constant) scales each
    class's terms; the mean then divides by the counted targets' total weight, as PyTorch's.

    The default (mean, no smoothing or weight, class indices) is the fused kernel, the rest
    log_softmax and nn.losses. Targets equal to `ignore_index` count for nothing (all: 0)."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if isinstance(targets, np.ndarray) and dtypes.is_floating(targets.dtype):
        targets = Tensor(targets)  # probabilities as an array, as a tensor
    if isinstance(targets, Tensor) and dtypes.is_floating(targets.dtype):
        return soft_target_loss(log_softmax(logits), targets, reduction, label_smoothing, weight)
    logits = classes_last(logits, targets)
    targets = check_class_targets("cross_entropy", logits, targets, ignore_index)
    if reduction != "mean" or label_smoothing or weight is not None:
        return nll_loss(log_softmax(logits), targets, ignore_index, reduction, weight=weight,
                        label_smoothing=label_smoothing)
    return CrossEntropy.apply(logits, targets=targets, ignore_index=ignore_index)


def dropout(x, p=0.5, training=True, generator=None):
    """Zero each element with probability p and scale the rest by 1/(1−p). The mask comes from
    `generator` (default: this thread's seeded generator): a run is deterministic for a given seed."""
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


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, *,
                                 causal=None, training=True, generator=None):
    """softmax(s · q kᵀ [+ mask]) v over the last two axes of (..., T, d) inputs, s = 1/√d
    unless `scale` is given. `is_causal` (or its alias `causal`) hides later keys;
    `attn_mask` is PyTorch's: bool (True = may attend) or float (added to the scores)."""
    is_causal = is_causal or bool(causal)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, not both")
    scores = q @ k.swapaxes(-1, -2)
    if attn_mask is not None and dtypes.is_floating(attn_mask.dtype):
        weights = softmax(scores * (scale or 1.0 / math.sqrt(q.shape[-1])) + attn_mask)
    else:  # hidden: above the diagonal (causal), or where a bool mask is False
        hidden = _causal_mask(q.shape[-2], k.shape[-2]) if is_causal else None
        if attn_mask is not None:
            hidden = ~np.asarray(attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask, dtype=bool)
        weights = Softmax.apply(scores, axis=-1, scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
                                mask=hidden)
    weights = dropout(weights, dropout_p, training, generator)
    return weights @ v

gelu, relu = unary_ops.gelu, unary_ops.relu  # the GPT's kernels (minitensor.unary_ops)