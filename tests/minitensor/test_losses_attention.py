"""Losses (minitensor.nn.losses, F.cross_entropy's options) and attention masks: values equal a
numpy reference, gradients equal central differences in float64, PyTorch's errors, and the
fused defaults (the GPT's kernels) are the ones that run."""
import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds

import minitensor as mt
import minitensor.nn.functional as F


def np_log_softmax(x):
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def reference_ce(x, t, ignore, reduction, eps):
    """PyTorch's formula: (1−ε)·nll + ε·mean_c(−logp), ignored rows 0, mean over counted rows."""
    logp = np_log_softmax(x)
    counted = t != ignore
    safe = np.where(counted, t, 0)
    loss = -(1 - eps) * np.take_along_axis(logp, safe[..., None], -1)[..., 0] - eps * logp.mean(-1)
    loss = np.where(counted, loss, 0)
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / max(counted.sum(), 1)}[reduction]


@given(rows=st.integers(0, 4), lead=st.booleans(), reduction=st.sampled_from(["none", "sum", "mean"]),
       eps=st.sampled_from([0.0, 0.1]), seed=seeds)
def test_cross_entropy_options_against_numpy(rows, lead, reduction, eps, seed):
    rng = np.random.default_rng(seed)
    shape = ((2,) if lead else ()) + (rows, 3)
    x = leaf(rng, shape)
    t = rng.integers(0, 3, size=shape[:-1])
    t[..., :1] = -100  # an ignored target
    loss = F.cross_entropy(x, mt.tensor(t), reduction=reduction, label_smoothing=eps)
    np.testing.assert_allclose(loss.data, reference_ce(x.data, t, -100, reduction, eps), rtol=1e-12, atol=1e-14)
    assert mt.gradcheck(lambda x: F.cross_entropy(x, mt.tensor(t), reduction=reduction, label_smoothing=eps), x)
    logp = F.log_softmax(x, dim=-1)
    np.testing.assert_allclose(F.nll_loss(logp, t, reduction=reduction).data,
                               reference_ce(x.data, t, -100, reduction, 0.0), rtol=1e-12, atol=1e-14)


@given(eps=st.sampled_from([0.0, 0.2]), reduction=st.sampled_from(["none", "sum", "mean"]), seed=seeds)
def test_cross_entropy_with_probability_targets(eps, reduction, seed):
    rng = np.random.default_rng(seed)
    x, q = leaf(rng, (3, 4)), F.softmax(leaf(rng, (3, 4)), dim=-1).detach()
    q.requires_grad = True
    smoothed = q.data * (1 - eps) + eps / 4
    per_row = -(smoothed * np_log_softmax(x.data)).sum(-1)
    expected = {"none": per_row, "sum": per_row.sum(), "mean": per_row.mean()}[reduction]
    np.testing.assert_allclose(F.cross_entropy(x, q, reduction=reduction, label_smoothing=eps).data, expected,
                               rtol=1e-12)
    assert mt.gradcheck(lambda x, q: F.cross_entropy(x, q, reduction=reduction, label_smoothing=eps), x, q)


def test_cross_entropy_default_is_the_fused_kernel():
    x, t = mt.tensor(np.zeros((2, 3)), requires_grad=True), mt.tensor([0, 2])
    assert F.cross_entropy(x, t)._node.name == "CrossEntropy"
    assert F.cross_entropy(x, t, reduction="sum")._node.name != "CrossEntropy"
    with pytest.raises(ValueError, match="reduction must be one of"):
        F.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        F.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="not a class in"):
        F.nll_loss(x, mt.tensor([0, 3]))


def reduced(per, reduction):
    return {"none": per, "sum": per.sum(), "mean": per.sum() / max(per.size, 1)}[reduction]


@given(shape=st.sampled_from([(), (0,), (3,), (2, 3)]), reduction=st.sampled_from(["none", "sum", "mean"]),
       seed=seeds, weighted=st.booleans())
def test_binary_cross_entropy_and_with_logits(shape, reduction, seed, weighted):
    """PyTorch's formulas: l = −w·(a·t·log p + (1−t)·log(1−p)), w the element weight, a the
    positives' weight (with logits only), both 1 unless given; the mean over elements."""
    rng = np.random.default_rng(seed)
    x, t = leaf(rng, shape), mt.tensor(rng.random(shape), requires_grad=True)
    p = mt.tensor(1 / (1 + np.exp(-x.data)), requires_grad=True)
    w, a = (rng.uniform(0.5, 2.0, shape[-1:]), rng.uniform(0.5, 3.0, shape[-1:])) if weighted else (None, None)
    w_, a_ = (1.0, 1.0) if w is None else (w, a)
    per = -w_ * (t.data * np.log(p.data) + (1 - t.data) * np.log(1 - p.data))
    np.testing.assert_allclose(F.binary_cross_entropy(p, t, w, reduction=reduction).data, reduced(per, reduction),
                               rtol=1e-10, atol=1e-12)
    per = -w_ * (a_ * t.data * np.log(p.data) + (1 - t.data) * np.log(1 - p.data))

    def with_logits(x, t):
        return F.binary_cross_entropy_with_logits(x, t, w, reduction=reduction, pos_weight=a)

    np.testing.assert_allclose(with_logits(x, t).data, reduced(per, reduction), rtol=1e-10, atol=1e-12)
    if per.size:
        assert mt.gradcheck(lambda p, t: F.binary_cross_entropy(p, t, w, reduction), p, t)
        assert mt.gradcheck(with_logits, x, t)


def test_binary_cross_entropy_errors_and_extremes():
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.binary_cross_entropy(mt.tensor([1.5]), mt.tensor([1.0]))
    with pytest.raises(ValueError, match="target's shape"):
        F.binary_cross_entropy_with_logits(mt.tensor([1.0, 2.0]), mt.tensor([1.0]))
    assert F.binary_cross_entropy(mt.tensor([0.0]), mt.tensor([1.0])).item() == 100.0  # log clamped at -100
    assert np.isfinite(F.binary_cross_entropy_with_logits(mt.tensor([-800.0]), mt.tensor([1.0])).item())
    assert np.isfinite(F.binary_cross_entropy_with_logits(mt.tensor([800.0]), mt.tensor([0.0]), pos_weight=3.0).item())
    with pytest.raises(ValueError, match="pos_weight \\(3,\\) does not broadcast to the input's shape \\(2,\\)"):
        F.binary_cross_entropy_with_logits(mt.tensor([1.0, 2.0]), mt.tensor([1.0, 0.0]), pos_weight=np.ones(3))


def np_attention(q, k, v, hidden, scale):
    scores = np.where(hidden, -np.inf, q @ np.swapaxes(k, -1, -2) * scale)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True) @ v


@given(t_q=st.integers(1, 3), t_k=st.integers(1, 3), seed=seeds)
def test_attention_masks_as_pytorch(t_q, t_k, seed):
    rng = np.random.default_rng(seed)
    q, k, v = leaf(rng, (2, t_q, 3)), leaf(rng, (2, t_k, 3)), leaf(rng, (2, t_k, 2))
    allowed = rng.random((t_q, t_k)) > 0.4
    allowed[:, 0] = True  # every query sees some key
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mt.tensor(allowed), scale=0.5)
    np.testing.assert_allclose(out.data, np_attention(q.data, k.data, v.data, ~allowed, 0.5), rtol=1e-12)
    bias = rng.standard_normal((t_q, t_k))
    added = F.scaled_dot_product_attention(q, k, v, attn_mask=mt.tensor(bias))
    scores = q.data @ np.swapaxes(k.data, -1, -2) / np.sqrt(3) + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(added.data, weights / weights.sum(-1, keepdims=True) @ v.data, rtol=1e-12)
    assert mt.gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mt.tensor(allowed)),
                        q, k, v)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_array_equal(causal.data, F.scaled_dot_product_attention(q, k, v, causal=True).data)
    with pytest.raises(ValueError, match="not both"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mt.tensor(allowed), is_causal=True)


def test_softmax_takes_dim_and_is_a_method():
    x = mt.tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(F.softmax(x, dim=0).data, F.softmax(x, axis=0).data)
    np.testing.assert_array_equal(x.softmax(-1).data, F.softmax(x).data)
    np.testing.assert_allclose(np.exp(x.log_softmax(1).data), x.softmax(1).data, rtol=1e-12)
    with pytest.raises(IndexError, match="softmax: dim 2"):
        x.softmax(2)
    assert x.add(1).sub(1).mul(2).div(2).neg().neg().data.tolist() == x.data.tolist()


@given(extra=st.integers(1, 2), reduction=st.sampled_from(["none", "sum", "mean"]), eps=st.sampled_from([0.0, 0.1]),
       seed=seeds)
def test_cross_entropy_and_nll_read_pytorchs_classes_in_dim_1(extra, reduction, eps, seed):
    """Integer targets (N, d1, ...) for scores (N, C, d1, ...) are PyTorch's layout: the same
    loss as the classes moved last (and the GPT's (B, T, V) with (B, T) targets keeps its)."""
    rng = np.random.default_rng(seed)
    n, c, sides = 2, 4, (3, 2)[:extra]
    x = leaf(rng, (n, c) + sides)
    t = rng.integers(0, c, size=(n,) + sides)
    t.reshape(-1)[0] = -100
    last = np.moveaxis(x.data, 1, -1)
    loss = F.cross_entropy(x, mt.tensor(t), reduction=reduction, label_smoothing=eps)
    np.testing.assert_allclose(loss.data, reference_ce(last, t, -100, reduction, eps), rtol=1e-12, atol=1e-14)
    assert mt.gradcheck(lambda x: F.cross_entropy(x, mt.tensor(t), reduction=reduction, label_smoothing=eps), x)
    np.testing.assert_allclose(F.nll_loss(F.log_softmax(x, dim=1), t, reduction=reduction).data,
                               reference_ce(last, t, -100, reduction, 0.0), rtol=1e-12, atol=1e-14)
    both = leaf(rng, (2, 3, 3))  # targets (2, 3) fit both readings: the engine's (classes last) wins
    targets = rng.integers(0, 3, size=(2, 3))
    np.testing.assert_allclose(F.cross_entropy(both, targets).data, reference_ce(both.data, targets, -100, "mean", 0))


@given(rows=st.integers(1, 4), reduction=st.sampled_from(["none", "sum", "mean"]), eps=st.sampled_from([0.0, 0.1]),
       seed=seeds)
def test_class_weights_as_pytorchs(rows, reduction, eps, seed):
    """PyTorch's weighted formula (aten LossNLL): lᵢ = −(1−ε)·w[tᵢ]·logpᵢ[tᵢ] − (ε/C)·Σ_c w_c·logpᵢ[c];
    the mean divides by Σ w[tᵢ] over counted rows. Probability targets: −Σ_c w_c·q_c·logp_c,
    the mean over rows."""
    rng = np.random.default_rng(seed)
    x, w = leaf(rng, (rows, 3)), rng.uniform(0.2, 2.0, 3)
    t = rng.integers(0, 3, size=rows)
    t[0] = -100
    logp = np_log_softmax(x.data)
    counted = t != -100
    safe = np.where(counted, t, 0)
    per_row = np.where(counted, -(1 - eps) * w[safe] * logp[np.arange(rows), safe] - eps / 3 * (logp @ w), 0)
    expected = {"none": per_row, "sum": per_row.sum(), "mean": per_row.sum() / (w[safe][counted].sum() or 1)}

    def weighted(x):
        return F.cross_entropy(x, t, reduction=reduction, label_smoothing=eps, weight=mt.tensor(w))

    np.testing.assert_allclose(weighted(x).data, expected[reduction], rtol=1e-12, atol=1e-14)
    assert mt.gradcheck(weighted, x)
    np.testing.assert_allclose(F.nll_loss(F.log_softmax(x, dim=-1), t, reduction=reduction, weight=w).data,
                               F.cross_entropy(x, t, reduction=reduction, weight=w).data, rtol=1e-12)
    q = F.softmax(leaf(rng, (rows, 3)), dim=-1).data
    soft = -(w * ((1 - eps) * q + eps / 3) * logp).sum(-1)
    np.testing.assert_allclose(F.cross_entropy(x, q, reduction=reduction, label_smoothing=eps, weight=w).data,
                               {"none": soft, "sum": soft.sum(), "mean": soft.mean()}[reduction], rtol=1e-12)
    with pytest.raises(ValueError, match="weight \\(2,\\) needs one entry per class"):
        F.cross_entropy(x, t, weight=np.ones(2))
