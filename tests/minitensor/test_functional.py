"""The fused ops of minitensor.nn.functional: values against numpy written from the
definitions, gradients against gradcheck (float64), and stability at logits of ±1e4."""
import math

import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds, shapes_and_axes, small_shapes

import minitensor as mt
from minitensor.nn import functional as F


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@given(shape_axis=shapes_and_axes(), seed=seeds)
def test_softmax_and_log_softmax(shape_axis, seed):
    shape, axis = shape_axis
    axis = axis if isinstance(axis, int) else -1
    x = leaf(np.random.default_rng(seed), shape, transposed=True)
    np.testing.assert_allclose(F.softmax(x, axis).data, np_softmax(x.data, axis), rtol=1e-12)
    np.testing.assert_allclose(F.log_softmax(x, axis).data, np.log(np_softmax(x.data, axis)), rtol=1e-12, atol=1e-14)
    assert mt.gradcheck(lambda x: F.softmax(x, axis), x)
    assert mt.gradcheck(lambda x: F.log_softmax(x, axis), x)


@given(shape=small_shapes.filter(lambda s: len(s) > 0 and s[-1] > 1), seed=seeds)
def test_layer_norm(shape, seed):
    rng = np.random.default_rng(seed)
    x, w, b = leaf(rng, shape, transposed=True), leaf(rng, shape[-1:]), leaf(rng, shape[-1:])
    mu, var = x.data.mean(-1, keepdims=True), x.data.var(-1, keepdims=True)
    expected = (x.data - mu) / np.sqrt(var + 1e-5) * w.data + b.data
    np.testing.assert_allclose(F.layer_norm(x, w, b).data, expected, rtol=1e-10, atol=1e-12)
    assert mt.gradcheck(F.layer_norm, x, w, b)


def np_cross_entropy(logits, targets, ignore_index):
    logp = np.log(np_softmax(logits, -1)).reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    counted = t != ignore_index
    return -logp[np.arange(len(t)), np.where(counted, t, 0)][counted].mean()


@given(batch=st.tuples(st.integers(1, 3), st.integers(1, 3)), vocab=st.integers(2, 5), seed=seeds)
def test_cross_entropy_with_ignored_targets(batch, vocab, seed):
    rng = np.random.default_rng(seed)
    logits = leaf(rng, batch + (vocab,))
    targets = rng.integers(0, vocab, size=batch)
    targets.flat[rng.random(targets.size) < 0.3] = -100
    targets.flat[0] = 1  # at least one counted token
    np.testing.assert_allclose(F.cross_entropy(logits, targets).item(),
                               np_cross_entropy(logits.data, targets, -100), rtol=1e-12)
    assert mt.gradcheck(lambda z: F.cross_entropy(z, targets), logits)
    F.cross_entropy(logits, targets).backward()
    np.testing.assert_array_equal(logits.grad[targets == -100], 0)  # ignored tokens get no gradient


def test_cross_entropy_custom_ignore_index_and_shape_errors():
    logits = mt.tensor(np.zeros((2, 3)), requires_grad=True)
    assert F.cross_entropy(logits, np.array([0, 2]), ignore_index=2).item() == math.log(3)
    try:
        F.cross_entropy(logits, np.array([0, 1, 2]))
        raise AssertionError("no error")
    except ValueError as e:
        assert "(2, 3)" in str(e) and "(3,)" in str(e) and "cross_entropy" in str(e)


def test_cross_entropy_rejects_targets_outside_the_classes():
    """A target of -1 used to be scored as class C-1 (numpy's negative index) and C as an IndexError."""
    logits = mt.tensor(np.zeros((3, 4)), requires_grad=True)
    for bad in (-1, 4, 9):
        with pytest.raises(ValueError, match=rf"cross_entropy: target {bad} is not a class in \[0, 4\) "
                                             r"and not ignore_index \(-100\)"):
            F.cross_entropy(logits, np.array([0, bad, 2]))
    assert F.cross_entropy(logits, np.array([0, -100, 3])).item() == math.log(4)
    assert F.cross_entropy(logits, np.array([0, -1, 3]), ignore_index=-1).item() == math.log(4)


@given(batch=st.tuples(st.integers(1, 3), st.integers(1, 3)), vocab=st.integers(2, 5),
       dtype=st.sampled_from([np.float32, np.float64]), ignore_index=st.sampled_from([-100, -1, 0]), seed=seeds)
def test_cross_entropy_with_every_target_ignored_is_zero_with_a_zero_gradient(batch, vocab, dtype, ignore_index,
                                                                             seed):
    """Documented and deliberate (PyTorch gives NaN): a micro-batch without counted tokens
    adds exactly nothing to a sum of losses, and nothing to any gradient."""
    logits = mt.tensor(np.random.default_rng(seed).standard_normal(batch + (vocab,)), dtype=dtype,
                       requires_grad=True)
    loss = F.cross_entropy(logits, np.full(batch, ignore_index), ignore_index=ignore_index)
    assert loss.shape == () and loss.dtype == dtype and loss.item() == 0.0
    loss.backward(np.array(3.0))  # a nonzero upstream gradient still gives zeros
    assert logits.grad is not None and logits.grad.dtype == dtype
    np.testing.assert_array_equal(logits.grad, np.zeros(logits.shape))


@given(seed=seeds)
def test_embedding_accumulates_repeated_indices(seed):
    rng = np.random.default_rng(seed)
    weight = leaf(rng, (4, 3))
    idx = np.array([[0, 2, 0], [2, 2, 1]])
    out = F.embedding(idx, weight)
    np.testing.assert_array_equal(out.data, weight.data[idx])
    grad = rng.standard_normal(out.shape)
    out.backward(grad)
    expected = np.zeros((4, 3))
    for i, row in zip(idx.reshape(-1), grad.reshape(-1, 3)):
        expected[i] += row
    np.testing.assert_allclose(weight.grad, expected, rtol=1e-12)
    assert mt.gradcheck(lambda w: F.embedding(idx, w), weight)


def test_embedding_rejects_out_of_range_and_float_indices():
    weight = mt.tensor(np.zeros((4, 2)))
    for bad, error in ((np.array([4]), IndexError), (np.array([-1]), IndexError), (np.array([0.0]), TypeError)):
        try:
            F.embedding(bad, weight)
            raise AssertionError(f"{bad} accepted")
        except error:
            pass


@given(p=st.sampled_from([0.1, 0.5, 0.9]), seed=seeds)
def test_dropout_is_deterministic_for_a_seeded_generator_and_scales_the_kept(p, seed):
    x = leaf(np.random.default_rng(seed), (8, 16))
    a = F.dropout(x, p, generator=np.random.default_rng(seed))
    b = F.dropout(x, p, generator=np.random.default_rng(seed))
    np.testing.assert_array_equal(a.data, b.data)
    kept = a.data != 0
    np.testing.assert_allclose(a.data[kept], x.data[kept] / (1 - p), rtol=1e-15)
    a.backward(np.ones(x.shape))
    np.testing.assert_allclose(x.grad, kept / (1 - p), rtol=1e-15)
    mt.manual_seed(seed)
    c = F.dropout(x, p)
    mt.manual_seed(seed)
    np.testing.assert_array_equal(c.data, F.dropout(x, p).data)  # the default generator is seeded too
    assert F.dropout(x, p, training=False) is x and F.dropout(x, 0.0) is x


def test_dropout_drops_about_p_and_rejects_p_of_one():
    x = mt.tensor(np.ones(100_000))
    dropped = (F.dropout(x, 0.3, generator=np.random.default_rng(0)).data == 0).mean()
    assert abs(dropped - 0.3) < 0.01
    try:
        F.dropout(x, 1.0)
        raise AssertionError("p=1 accepted")
    except ValueError as e:
        assert "1.0" in str(e)


def np_attention(q, k, v, causal):
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    return np_softmax(scores, -1) @ v


@given(causal=st.booleans(), b=st.integers(1, 2), t=st.integers(1, 4), d=st.integers(1, 3), seed=seeds)
def test_scaled_dot_product_attention(causal, b, t, d, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (leaf(rng, (b, 2, t, d)) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, causal=causal)
    np.testing.assert_allclose(out.data, np_attention(q.data, k.data, v.data, causal), rtol=1e-10, atol=1e-12)
    assert mt.gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=causal), q, k, v)


def test_causal_attention_ignores_future_values():
    rng = np.random.default_rng(0)
    q, k, v = (mt.tensor(rng.standard_normal((1, 5, 4))) for _ in range(3))
    before = F.scaled_dot_product_attention(q, k, v, causal=True).data
    v.data[:, 3:] += 100.0
    k.data[:, 3:] -= 50.0
    after = F.scaled_dot_product_attention(q, k, v, causal=True).data
    np.testing.assert_array_equal(after[:, :3], before[:, :3])
    assert not np.allclose(after[:, 3:], before[:, 3:])


@given(dtype=st.sampled_from([np.float32, np.float64]))
def test_huge_logits_stay_finite_and_correct(dtype):
    logits = mt.tensor(np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], dtype=dtype), requires_grad=True)
    np.testing.assert_allclose(F.softmax(logits).data, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    np.testing.assert_allclose(F.log_softmax(logits).data, [[0, -2e4, -1e4], [-math.log(3)] * 3], rtol=1e-6)
    loss = F.cross_entropy(logits, np.array([1, 2]))
    np.testing.assert_allclose(loss.item(), (2e4 + math.log(3)) / 2, rtol=1e-6)
    loss.backward()
    assert loss.dtype == dtype and logits.grad.dtype == dtype
    np.testing.assert_allclose(logits.grad, [[0.5, -0.5, 0], [1 / 6, 1 / 6, -1 / 3]], rtol=1e-6, atol=1e-7)
    for out in (F.softmax(logits * 1.0), F.log_softmax(logits * 1.0)):
        out.backward(np.ones(out.shape, dtype))
    assert np.isfinite(logits.grad).all()


def test_causal_mask_is_aligned_top_left_as_pytorch():
    """With fewer queries than keys, query i still sees keys 0..i only."""
    rng = np.random.default_rng(0)
    q, k, v = (mt.tensor(rng.standard_normal((1, 1, t, 3))) for t in (2, 4, 4))
    out = F.scaled_dot_product_attention(q, k, v, causal=True).data[0, 0]
    np.testing.assert_allclose(out[0], v.data[0, 0, 0], rtol=1e-12)  # query 0 sees key 0 only
    scores = q.data[0, 0, 1] @ k.data[0, 0, :2].T / np.sqrt(3)
    weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    np.testing.assert_allclose(out[1], weights @ v.data[0, 0, :2], rtol=1e-12)
