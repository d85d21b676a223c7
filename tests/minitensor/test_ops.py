"""Every op in minitensor.ops, reductions, unary_ops and shape_ops: forward equals plain numpy, and
backward equals central differences (gradcheck, float64) over hypothesis-drawn shapes,
broadcasting, size-1 dims, negative axes, keepdims and non-contiguous inputs."""
import functools
import math

import numpy as np
import pytest
from helpers import away_from_zero, leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import broadcastable_pairs, matmul_shapes, seeds, shapes_and_axes, small_shapes, transposed_layouts

import minitensor as mt

BINARY = {"add": (np.add, False), "sub": (np.subtract, False), "mul": (np.multiply, False),
          "div": (np.divide, True)}  # name: (numpy reference, divisor must avoid 0)


@given(op=st.sampled_from(sorted(BINARY)), shapes=broadcastable_pairs, transposed=transposed_layouts, seed=seeds)
def test_binary_ops_broadcast_forward_and_backward(op, shapes, transposed, seed):
    rng = np.random.default_rng(seed)
    reference, positive_b = BINARY[op]
    a = leaf(rng, shapes.input_shapes[0], transposed)
    b = leaf(rng, shapes.input_shapes[1], transposed, positive=positive_b)
    fn = getattr(mt.ops, op)
    np.testing.assert_array_equal(fn(a, b).data, reference(a.data, b.data))
    assert mt.gradcheck(fn, a, b)


@given(shapes=broadcastable_pairs, seed=seeds)
def test_binary_op_with_a_constant_operand_only_differentiates_the_other(shapes, seed):
    rng = np.random.default_rng(seed)
    a = leaf(rng, shapes.input_shapes[0])
    b = leaf(rng, shapes.input_shapes[1], requires_grad=False)
    assert mt.gradcheck(lambda a, b: a * b - b, a, b)
    assert mt.gradcheck(lambda a: 2.0 / (a * a + 1.0) - 3 + a * 0.5, a)  # Python scalars on either side


UNARY = {  # name: (numpy reference, input must be positive)
    "exp": (np.exp, False), "log": (np.log, True), "sqrt": (np.sqrt, True), "tanh": (np.tanh, False),
    "neg": (np.negative, False), "relu": (lambda x: np.maximum(x, 0), False),
    "gelu": (lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2))), False),  # exact: the default
    "gelu_tanh": (lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))), False),
}


@given(op=st.sampled_from(sorted(UNARY)), shape=small_shapes, transposed=transposed_layouts, seed=seeds)
def test_unary_ops_forward_and_backward(op, shape, transposed, seed):
    reference, positive = UNARY[op]
    x = away_from_zero(leaf(np.random.default_rng(seed), shape, transposed, positive=positive))
    fn = (functools.partial(mt.unary_ops.gelu, approximate="tanh") if op == "gelu_tanh"
          else getattr(mt.ops if op == "neg" else mt.unary_ops, op))
    np.testing.assert_allclose(fn(x).data, reference(x.data), rtol=1e-12, atol=1e-15)
    assert mt.gradcheck(fn, x)


@given(shape=small_shapes, exponent=st.sampled_from([2, 3, 0.5, -1.5, np.float64(2.5)]), seed=seeds)
def test_pow_forward_and_backward(shape, exponent, seed):
    x = leaf(np.random.default_rng(seed), shape, positive=True)
    np.testing.assert_allclose((x**exponent).data, x.data**exponent, rtol=1e-12)
    assert mt.gradcheck(lambda x: x**exponent, x)


@given(shapes=matmul_shapes, transposed=transposed_layouts, seed=seeds)
def test_matmul_batched_and_broadcast_forward_and_backward(shapes, transposed, seed):
    rng = np.random.default_rng(seed)
    a, b = (leaf(rng, s, transposed) for s in shapes.input_shapes)
    np.testing.assert_allclose((a @ b).data, np.matmul(a.data, b.data), rtol=1e-12, atol=1e-12)
    assert mt.gradcheck(lambda a, b: a @ b, a, b)


@given(data=st.data(), seed=seeds)
def test_matmul_of_transposed_views_uses_their_values(data, seed):
    rng = np.random.default_rng(seed)
    m, k, n = (data.draw(st.integers(1, 3)) for _ in range(3))
    a, b = leaf(rng, (k, m)), leaf(rng, (2, n, k))
    np.testing.assert_allclose((a.T @ b.transpose(-1, -2)).data, a.data.T @ np.swapaxes(b.data, -1, -2))
    assert mt.gradcheck(lambda a, b: a.T @ b.swapaxes(-2, -1), a, b)


@given(op=st.sampled_from(["sum", "mean", "max"]), shape_axis=shapes_and_axes(), keepdims=st.booleans(),
       transposed=transposed_layouts, seed=seeds)
def test_reductions_forward_and_backward(op, shape_axis, keepdims, transposed, seed):
    shape, axis = shape_axis
    x = leaf(np.random.default_rng(seed), shape, transposed)
    out = getattr(x, op)(axis=axis, keepdims=keepdims)
    expected = getattr(np, {"max": "amax"}.get(op, op))(x.data, axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.data, expected, rtol=1e-12)
    assert mt.gradcheck(lambda x: getattr(x, op)(axis=axis, keepdims=keepdims), x)


def test_max_splits_the_gradient_among_ties():
    x = mt.tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 0.0]]), requires_grad=True)
    x.max(axis=-1).backward(np.array([1.0, 4.0]))
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [4, 0, 0]])


@given(shape=small_shapes, seed=seeds, data=st.data())
def test_reshape_and_permute(shape, seed, data):
    x = leaf(np.random.default_rng(seed), shape, transposed=True)
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    negative_axes = tuple(a - len(shape) for a in axes)
    np.testing.assert_array_equal(x.permute(*negative_axes).data, np.transpose(x.data, axes))
    np.testing.assert_array_equal(x.reshape(-1).data, x.data.reshape(-1))
    assert mt.gradcheck(lambda x: x.permute(negative_axes).reshape(-1, 1), x)
    assert mt.gradcheck(lambda x: x.T * 1.0, x)


def test_permute_backward_applies_the_inverse_permutation():
    # (1, 2, 0) is not its own inverse, unlike every swap of two axes: backward must use (2, 0, 1)
    x = leaf(np.random.default_rng(0), (2, 3, 4))
    assert mt.gradcheck(lambda x: x.permute(1, 2, 0) * mt.tensor(np.arange(24.0).reshape(3, 4, 2)), x)


@given(seed=seeds, axes=st.tuples(st.integers(-3, 2), st.integers(-3, 2)))
def test_swapaxes_and_transpose(seed, axes):
    x = leaf(np.random.default_rng(seed), (2, 3, 1))
    np.testing.assert_array_equal(x.swapaxes(*axes).data, np.swapaxes(x.data, *axes))
    np.testing.assert_array_equal(x.transpose(*axes).data, np.swapaxes(x.data, *axes))
    assert mt.gradcheck(lambda x: x.transpose(*axes), x)


INDICES = [
    (slice(None), 1), (Ellipsis, slice(None, None, -1)), (slice(1, None), None, slice(None, 2)), -1,
    np.array([0, 0, 2, 0]),  # repeated rows: their gradients add up
    (np.array([1, 1]), np.array([2, 2])),  # the same element twice
    (slice(None), np.array([2, 0, 2])),
]


@given(index=st.sampled_from(INDICES), seed=seeds)
def test_getitem_forward_and_backward(index, seed):
    x = leaf(np.random.default_rng(seed), (3, 3), transposed=True)
    np.testing.assert_array_equal(x[index].data, x.data[index])
    assert mt.gradcheck(lambda x: x[index], x)


def test_getitem_with_a_boolean_mask():
    x = mt.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    mask = np.array([[True, False, True], [False, True, False]])
    x[mask].backward(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(x.grad, [[1, 0, 2], [0, 3, 0]])


@given(shape=small_shapes.filter(lambda s: len(s) > 0), n=st.integers(1, 3), data=st.data(), seed=seeds)
def test_concat_stack_split_round_trip(shape, n, data, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    parts = [leaf(rng, shape[:axis % len(shape)] + (data.draw(st.integers(1, 3)),) + shape[axis % len(shape) + 1:])
             for _ in range(n)]
    joined = mt.concat(parts, axis=axis)
    np.testing.assert_array_equal(joined.data, np.concatenate([p.data for p in parts], axis=axis))
    for piece, part in zip(joined.split([p.shape[axis] for p in parts], axis=axis), parts):
        np.testing.assert_array_equal(piece.data, part.data)
    assert mt.gradcheck(lambda *ps: mt.concat(ps, axis=axis), *parts)
    same = [leaf(rng, shape) for _ in range(n)]
    np.testing.assert_array_equal(mt.stack(same, axis=axis).data, np.stack([p.data for p in same], axis=axis))
    assert mt.gradcheck(lambda *ps: mt.stack(ps, axis=axis - 1 if axis < 0 else axis), *same)
    assert mt.gradcheck(lambda x: mt.concat(x.split(2, axis=axis)[::-1], axis=axis), same[0])


@given(shapes=broadcastable_pairs, seed=seeds)
def test_where_and_masked_fill(shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (leaf(rng, s) for s in shapes.input_shapes)
    cond = rng.random(shapes.result_shape) < 0.5
    np.testing.assert_array_equal(mt.where(cond, a, b).data, np.where(cond, a.data, b.data))
    assert mt.gradcheck(lambda a, b: mt.where(cond, a, b), a, b)
    mask = rng.random(a.shape) < 0.5
    np.testing.assert_array_equal(a.masked_fill(mask, -7.0).data, np.where(mask, -7.0, a.data))
    assert mt.gradcheck(lambda a: a.masked_fill(mask, -7.0), a)


def test_unbroadcast_sums_added_and_stretched_axes():
    grad = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(mt.ops.unbroadcast(grad, (3, 1)), grad.sum(axis=(0, 2)).reshape(3, 1))
    np.testing.assert_array_equal(mt.ops.unbroadcast(grad, ()), grad.sum())
    assert mt.ops.unbroadcast(grad, (2, 3, 4)) is grad


FLOAT32_PROGRAMS = {  # every op once; backward must never compute in float64
    "arithmetic": lambda x, y: (x + y - x * y / (y * y + 1.0)) ** 2 - x,
    "matmul": lambda x, y: x @ y.T,
    "reductions": lambda x, y: x.sum(axis=0) + x.mean(axis=1, keepdims=True).sum() + x.max(axis=-1).sum() * y.max(),
    "unary": lambda x, y: x.exp() + (y * y + 1.0).log() + (x * x + 1.0).sqrt() + x.tanh() + x.relu() + x.gelu(),
    "shape": lambda x, y: mt.concat([x.reshape(-1), y.T.reshape(-1)])[2:] * mt.stack([x, y]).sum(),
    "where": lambda x, y: mt.where(x.data > 0, x, y).masked_fill(y.data > 1, 0.0),
}


@given(program=st.sampled_from(sorted(FLOAT32_PROGRAMS)), seed=seeds)
def test_float32_backward_never_upcasts(program, seed):
    """autograd checks every gradient's dtype against its tensor's, so a float64
    intermediate anywhere in a backward raises instead of being cast away at a leaf."""
    rng = np.random.default_rng(seed)
    x, y = (mt.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True) for _ in range(2))
    out = FLOAT32_PROGRAMS[program](x, y)
    assert out.dtype == np.float32
    out.sum().backward()
    assert x.grad.dtype == y.grad.dtype == np.float32


def test_numpy_integers_work_as_sizes_and_a_zero_chunk_is_named():
    x = mt.tensor(np.arange(12.0))
    assert x.reshape(np.int64(4), 3).shape == (4, 3)
    assert x.reshape(3, 4).permute(np.int64(1), 0).shape == (4, 3)
    assert [c.shape for c in x.split(np.int64(5))] == [(5,), (5,), (2,)]
    with pytest.raises(ValueError, match="chunk size must be ≥ 1, got 0"):
        x.split(0)
