"""Losses beyond the fused cross-entropy kernel: `nll_loss`, `binary_cross_entropy`,
`binary_cross_entropy_with_logits`, and the pieces `F.cross_entropy` composes when asked
for more than its fused default (`reduction=`, `label_smoothing=`, probability targets).

Classes are the LAST dim here, `(..., C)` with targets `(...)`, as the GPT's logits are
(PyTorch puts them in dim 1). Each elementwise loss is one Function; `reduction` is
then 'none', 'sum' or 'mean' (over the counted entries) with the ordinary ops.
"""
import numpy as np

from minitensor import reductions
from minitensor.autograd import Function
from minitensor.nn.checks import check_class_targets, classes_last
from minitensor.operands import dtype_mismatch, unbroadcast
from minitensor.tensor import Tensor

REDUCTIONS = ("none", "mean", "sum")


class NLLLoss(Function):
    """Per row i, with class weights w (all 1 unless given) and label smoothing ε:
        lᵢ = −(1−ε)·w[tᵢ]·logpᵢ[tᵢ] − (ε/C)·Σ_c w_c·logpᵢ[c],   0 where tᵢ is ignored;
        dlogpᵢ[c] = −dlᵢ·((1−ε)·w[tᵢ]·[c = tᵢ] + (ε/C)·w_c) on counted rows, 0 elsewhere."""

    def forward(self, logp, safe, counted, smoothing, weight):
        self.shape, self.safe, self.counted, self.smoothing, self.weight = logp.shape, safe, counted, smoothing, weight
        picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0] * weight[safe]
        loss = -(1 - smoothing) * picked - (smoothing / logp.shape[-1]) * (logp @ weight) if smoothing else -picked
        return np.where(counted, loss, np.zeros((), logp.dtype))

    def backward(self, grad):
        scale = np.where(self.counted, -grad, np.zeros((), grad.dtype))[..., None]
        dlogp = scale * ((self.smoothing / self.shape[-1]) * self.weight)
        np.put_along_axis(dlogp, self.safe[..., None], np.take_along_axis(dlogp, self.safe[..., None], -1)
                          + (1 - self.smoothing) * self.weight[self.safe][..., None] * scale, -1)
        return dlogp


class BinaryCrossEntropy(Function):
    """l = −(t·log p + (1−t)·log(1−p)), each log clamped at −100 as in PyTorch.
    dp = (p − t) / max(p(1−p), 1e-12);  dt = log(1−p) − log p (clamped alike)."""

    def forward(self, p, t):
        with np.errstate(divide="ignore"):
            log_p, log_q = np.maximum(np.log(p), -100), np.maximum(np.log1p(-p), -100)
        self.save_for_backward(p, t, log_p, log_q)
        return -(t * log_p + (1 - t) * log_q)

    def backward(self, grad):
        p, t, log_p, log_q = self.saved
        dp = grad * (p - t) / np.maximum(p * (1 - p), 1e-12)
        return unbroadcast(dp, p.shape), unbroadcast(grad * (log_q - log_p), t.shape)


def _softplus(z):
    """log(1 + eᶻ) = max(z, 0) + log(1 + e^−|z|), stable for any z."""
    return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


class BinaryCrossEntropyWithLogits(Function):
    """l = −(a·t·log σ(x) + (1−t)·log(1−σ(x))) with a the positives' weight (pos_weight, 1
    by default); since −log σ(x) = softplus(−x) and −log(1−σ(x)) = softplus(x), stable:
        l = a·t·softplus(−x) + (1−t)·softplus(x);
        dx = σ(x)·(a·t + 1 − t) − a·t;   dt = a·softplus(−x) − softplus(x)  (−x when a = 1)."""

    def forward(self, x, t, pos_weight):
        self.save_for_backward(x, t)
        self.pos_weight = pos_weight
        return pos_weight * t * _softplus(-x) + (1 - t) * _softplus(x)

    def backward(self, grad):
        x, t = self.saved
        a, sigmoid = self.pos_weight, np.exp(-np.logaddexp(0, -x))
        return (unbroadcast(grad * (sigmoid * (a * t + 1 - t) - a * t), x.shape),
                unbroadcast(grad * (a * _softplus(-x) - _softplus(x)), t.shape))


def reduce(op, loss, reduction, count=None):
    """The per-entry `loss` as asked: 'none' as is, 'sum', or 'mean' over `count` entries
    (all of them if None; a count of 0, a batch with nothing counted, gives 0, not NaN).
    With class weights the count is the counted targets' total weight, as PyTorch's."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if reduction == "none":
        return loss
    total = reductions.sum(loss)
    return total if reduction == "sum" else total * (1.0 / ((loss.size if count is None else count) or 1))


def class_weights(op, weight, scores):
    """The per-class `weight` (a constant: no gradient) as an array of the scores' dtype,
    one entry per class; all 1 if None."""
    if weight is None:
        return np.ones(scores.shape[-1], scores.dtype)
    weight = np.asarray(weight.data if isinstance(weight, Tensor) else weight)
    if weight.shape != scores.shape[-1:]:
        raise ValueError(f"{op}: weight {weight.shape} needs one entry per class, {scores.shape[-1:]}")
    if weight.dtype != scores.dtype:
        raise dtype_mismatch(op, scores, Tensor(weight))
    return weight


def nll_loss(input, target, ignore_index=-100, reduction="mean", *, weight=None, label_smoothing=0.0):
    """−w[target]·logp[target] per entry of log-probabilities `input (..., C)`, reduced (the
    mean divides by the counted targets' total weight); entries whose target is
    `ignore_index` count for nothing (nor in the mean's count)."""
    input = classes_last(input, target)
    targets = check_class_targets("nll_loss", input, target, ignore_index)
    w = class_weights("nll_loss", weight, input)
    counted = targets != ignore_index
    safe = np.where(counted, targets, 0)
    loss = NLLLoss.apply(input, safe=safe, counted=counted, smoothing=float(label_smoothing), weight=w)
    return reduce("nll_loss", loss, reduction, float(w[safe][counted].sum()) if weight is not None
                  else int(counted.sum()))


def soft_target_loss(logp, probabilities, reduction, label_smoothing=0.0, weight=None):
    """−Σ_c w_c·q_c·logp_c per row for target probabilities q (smoothed: (1−ε)q + ε/C) and
    class weights w, reduced over the rows (PyTorch's cross_entropy with probability
    targets: its mean divides by the number of rows, weights or not)."""
    if probabilities.shape != logp.shape:
        raise ValueError(f"cross_entropy: probability targets {probabilities.shape} need the input's shape "
                         f"{logp.shape}")
    if probabilities.dtype != logp.dtype:
        raise dtype_mismatch("cross_entropy", logp, probabilities)
    if label_smoothing:
        probabilities = probabilities * (1 - label_smoothing) + label_smoothing / logp.shape[-1]
    if weight is not None:
        probabilities = probabilities * Tensor(class_weights("cross_entropy", weight, logp))
    return reduce("cross_entropy", -reductions.sum(probabilities * logp, -1), reduction)


def _binary_operands(op, input, target):
    target = target if isinstance(target, Tensor) else Tensor(np.asarray(target, dtype=input.dtype))
    if target.shape != input.shape:
        raise ValueError(f"{op}: the target's shape {target.shape} differs from the input's {input.shape}")
    if target.dtype != input.dtype:
        raise dtype_mismatch(op, input, target)
    return input, target


def _elementwise_weight(op, name, weight, input):
    """A constant `weight` (array, tensor or number) that broadcasts to the input's shape,
    in its dtype; None stays None."""
    if weight is None:
        return None
    weight = np.asarray(weight.data if isinstance(weight, Tensor) else weight, dtype=input.dtype)
    fits = weight.ndim <= input.ndim and all(w in (1, n) for w, n in zip(weight.shape[::-1], input.shape[::-1]))
    if not fits:
        raise ValueError(f"{op}: {name} {weight.shape} does not broadcast to the input's shape {input.shape}")
    return weight


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """−w·(t·log p + (1−t)·log(1−p)) for probabilities `input` in [0, 1], reduced; `weight`
    (broadcast to the input) rescales each element's loss, as in PyTorch."""
    input, target = _binary_operands("binary_cross_entropy", input, target)
    if input.size and not ((input.data >= 0).all() and (input.data <= 1).all()):
        raise ValueError("binary_cross_entropy: all elements of input should be between 0 and 1")
    weight = _elementwise_weight("binary_cross_entropy", "weight", weight, input)
    loss = BinaryCrossEntropy.apply(input, target)
    return reduce("binary_cross_entropy", loss if weight is None else loss * Tensor(weight), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", *, pos_weight=None):
    """binary_cross_entropy(sigmoid(input), target, weight), computed stably from the
    logits; `pos_weight` (broadcast over the last dim: one per class) weighs the positive
    term, as in PyTorch."""
    op = "binary_cross_entropy_with_logits"
    input, target = _binary_operands(op, input, target)
    weight = _elementwise_weight(op, "weight", weight, input)
    pos_weight = _elementwise_weight(op, "pos_weight", pos_weight, input)
    loss = BinaryCrossEntropyWithLogits.apply(input, target, pos_weight=1.0 if pos_weight is None else pos_weight)
    return reduce(op, loss if weight is None else loss * Tensor(weight), reduction)
