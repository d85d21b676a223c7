"""Elementwise math and activations (minitensor.math_ops, activations, ops.pow): forward equals
a numpy reference over 0-d, zero-size and broadcast shapes, backward equals central
differences (gradcheck, float64), integers compute in float32, and PyTorch's choices at
kinks and ties hold."""
import math

import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import broadcastable_pairs_with_empty, seeds, shapes_with_empty

import minitensor as mt
import minitensor.nn.functional as F

erf = np.vectorize(math.erf, otypes=[float])


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# name: (function, numpy reference, domain of the input: "any", "positive" or "unit" (|x| < 1))
UNARY = {
    "abs": (mt.abs, np.abs, "any"), "sin": (mt.sin, np.sin, "any"), "cos": (mt.cos, np.cos, "any"),
    "tan": (mt.tan, np.tan, "unit"), "asin": (mt.asin, np.arcsin, "unit"), "acos": (mt.acos, np.arccos, "unit"),
    "atan": (mt.atan, np.arctan, "any"), "sinh": (mt.sinh, np.sinh, "any"), "cosh": (mt.cosh, np.cosh, "any"),
    "exp2": (mt.exp2, np.exp2, "any"), "log2": (mt.log2, np.log2, "positive"),
    "log10": (mt.log10, np.log10, "positive"), "log1p": (mt.log1p, np.log1p, "positive"),
    "expm1": (mt.expm1, np.expm1, "any"), "rsqrt": (mt.rsqrt, lambda x: 1 / np.sqrt(x), "positive"),
    "reciprocal": (mt.reciprocal, lambda x: 1 / x, "positive"), "square": (mt.square, np.square, "any"),
    "erf": (mt.erf, erf, "any"),
    "sigmoid": (mt.sigmoid, sigmoid, "any"), "logsigmoid": (F.logsigmoid, lambda x: np.log(sigmoid(x)), "any"),
    "silu": (F.silu, lambda x: x * sigmoid(x), "any"),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x), "any"),
    "elu": (lambda x: F.elu(x, 1.5), lambda x: np.where(x > 0, x, 1.5 * np.expm1(x)), "any"),
    "softplus": (lambda x: F.softplus(x, beta=2.0, threshold=1.0),
                 lambda x: np.where(2 * x > 1, x, np.log1p(np.exp(2 * x)) / 2), "any"),
    "relu6": (lambda x: F.relu6(x * 4), lambda x: np.clip(x * 4, 0, 6), "any"),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), "any"),
    "hardsigmoid": (lambda x: F.hardsigmoid(x * 4), lambda x: np.clip(x * 4 / 6 + 0.5, 0, 1), "any"),
    "gelu_none": (lambda x: F.gelu(x, approximate="none"), lambda x: x * 0.5 * (1 + erf(x / np.sqrt(2))), "any"),
    "clamp": (lambda x: x.clamp(-0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7), "any"),
    "clip_min": (lambda x: mt.clip(x, min=0.2), lambda x: np.maximum(x, 0.2), "any"),
}


def draw_input(rng, shape, domain):
    x = np.asarray(rng.standard_normal(shape))
    if domain == "positive":
        return np.abs(x) + 0.5
    return np.tanh(x) * 0.9 if domain == "unit" else x


def away_from_kinks(x, kinks=(-0.5, 0.0, 0.2, 0.5, 0.7, 1.5), margin=0.05):
    """Move values off the ops' kinks (clamp's bounds, 0, relu6's 6/4) so central differences see one side."""
    x = np.array(x)
    for k in kinks:
        near = np.abs(x - k) < margin
        x[near] = k + np.where(x[near] >= k, margin, -margin)
    return x


@pytest.mark.parametrize("op", sorted(UNARY))
@given(shape=shapes_with_empty, seed=seeds)
def test_unary_ops_forward_and_backward(op, shape, seed):
    fn, reference, domain = UNARY[op]
    x = mt.tensor(away_from_kinks(draw_input(np.random.default_rng(seed), shape, domain)), requires_grad=True)
    out = fn(x)
    assert out.shape == x.shape and out.dtype == np.float64
    np.testing.assert_allclose(out.data, reference(x.data), rtol=1e-12, atol=1e-14)
    assert mt.gradcheck(fn, x)


@given(op=st.sampled_from(sorted(UNARY)), seed=seeds)
def test_unary_ops_keep_float32_and_compute_integers_in_float32(op, seed):
    fn, reference, domain = UNARY[op]
    x = draw_input(np.random.default_rng(seed), (3,), domain).astype(np.float32)
    assert fn(mt.tensor(x)).dtype == np.float32
    ints = mt.tensor([1, 2, 3] if domain != "unit" else [0, 0, 0])
    expected = np.int64 if op in ("abs", "square") else np.float32  # abs and square keep integers, as in PyTorch
    assert fn(ints).dtype == expected


def test_rounding_and_sign_have_zero_gradient_and_round_half_to_even():
    x = mt.tensor([-1.5, -0.5, 0.5, 1.5, 2.7], requires_grad=True)
    for fn, expected in [(mt.floor, [-2, -1, 0, 1, 2]), (mt.ceil, [-1, -0, 1, 2, 3]), (mt.trunc, [-1, 0, 0, 1, 2]),
                         (mt.round, [-2, -0, 0, 2, 3]), (mt.sign, [-1, -1, 1, 1, 1])]:
        np.testing.assert_array_equal(fn(x).data, expected)
        fn(x).sum().backward()
        np.testing.assert_array_equal(x.grad, 0)
    assert mt.round(mt.tensor([1.234]), decimals=2).item() == pytest.approx(1.23)
    assert mt.floor(mt.tensor([3])).dtype == np.int64


def test_derivatives_at_kinks_are_pytorchs():
    x = mt.tensor(np.array([0.0, -1.0, 1.0]), requires_grad=True)
    cases = [(lambda x: x.abs(), [0, -1, 1]), (lambda x: F.leaky_relu(x, 0.1), [0.1, 0.1, 1]),
             (lambda x: F.elu(x, 2.0), [2, 2 * np.exp(-1), 1]), (lambda x: x.clamp(0, 1), [1, 0, 1]),
             (lambda x: F.hardtanh(x, 0, 1), [0, 0, 0]), (lambda x: x.clamp(min=mt.tensor(0.0)), [0.5, 0, 1]),
             (lambda x: mt.maximum(x, mt.zeros(3, dtype=mt.float64)), [0.5, 0, 1])]
    for fn, expected in cases:
        x.grad = None
        fn(x).sum().backward()
        np.testing.assert_allclose(x.grad, expected)


@given(op=st.sampled_from(["maximum", "minimum"]), shapes=broadcastable_pairs_with_empty, seed=seeds)
def test_maximum_minimum_broadcast(op, shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (leaf(rng, s) for s in shapes.input_shapes)
    np.testing.assert_array_equal(getattr(mt, op)(a, b).data, getattr(np, op)(a.data, b.data))
    assert mt.gradcheck(getattr(mt, op), a, b)
    np.testing.assert_array_equal(a.max(b).data, np.maximum(a.data, b.data))  # torch.max(a, b)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@given(shapes=broadcastable_pairs_with_empty, seed=seeds)
def test_arithmetic_over_0d_zero_size_and_broadcast_shapes(op, shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = leaf(rng, shapes.input_shapes[0]), leaf(rng, shapes.input_shapes[1], positive=True)
    out = getattr(mt, op)(a, b)
    np.testing.assert_array_equal(out.data, getattr(np, {"sub": "subtract", "mul": "multiply", "div": "divide"}.get(
        op, op))(a.data, b.data))
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert mt.gradcheck(getattr(mt, op), a, b)


def test_a_non_number_operand_is_named():
    with pytest.raises(TypeError, match="needs numbers .*, got str 'abc'"):
        mt.ones(2) + "abc"


@given(shapes=broadcastable_pairs_with_empty, seed=seeds)
def test_pow_with_a_tensor_exponent_and_a_number_base(shapes, seed):
    rng = np.random.default_rng(seed)
    a = leaf(rng, shapes.input_shapes[0], positive=True)
    b = leaf(rng, shapes.input_shapes[1])
    np.testing.assert_allclose((a**b).data, a.data**b.data, rtol=1e-12)
    assert mt.gradcheck(lambda a, b: a**b, a, b)
    np.testing.assert_allclose((2.0**b).data, 2.0**b.data, rtol=1e-12)
    assert mt.gradcheck(lambda b: 2.0**b, b) and mt.gradcheck(lambda a: mt.pow(a, 3), a)


def test_pow_at_zero_follows_pytorch():
    """The issue's case: d(x ** 0.0)/dx at 0 was NaN; PyTorch gives 0."""
    x = mt.tensor([0.0, 2.0], requires_grad=True)
    (x**0.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [0, 0])
    x.grad = None
    e = mt.tensor([0.0, 2.0], requires_grad=True)
    (x**e).sum().backward()
    np.testing.assert_array_equal(x.grad, [0, 4])  # b·a^(b−1), 0 where b = 0
    np.testing.assert_allclose(e.grad, [0, 4 * np.log(2)])  # y·ln a, 0 at a = 0
    assert (mt.tensor([2, 3]) ** 2).dtype == np.int64 and (mt.tensor([2, 3]) ** 0.5).dtype == np.float32
    assert (2 ** mt.tensor([1, 2])).dtype == np.int64 and (2.5 ** mt.tensor([1, 2])).dtype == np.float32


def test_activation_errors_name_the_argument():
    x = mt.zeros(2)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        F.gelu(x, approximate="erf")
    with pytest.raises(ValueError, match="clamp: give at least one of min and max"):
        x.clamp()
    with pytest.raises(ValueError, match="hardtanh: min_val 1 is greater than max_val 0"):
        F.hardtanh(x, 1, 0)


def test_stable_for_large_inputs():
    x = mt.tensor([-1000.0, 1000.0], requires_grad=True)
    for fn in (mt.sigmoid, F.logsigmoid, F.silu, F.softplus):
        y = fn(x)
        y.sum().backward()
        assert np.isfinite(y.data).all() and np.isfinite(x.grad).all()
        x.grad = None
