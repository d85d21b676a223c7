"""Comparisons and logic (minitensor.comparison): elementwise like numpy over 0-d, zero-size
and broadcast shapes, bool results that record no gradient, PyTorch's errors, and the
identity hashing an elementwise `==` needs."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import broadcastable_pairs_with_empty, promotion_dtypes, seeds, shapes_with_empty

import minitensor as mt

COMPARISONS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
               "ne": np.not_equal}
OPERATORS = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
             "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def small_ints(rng, shape, dtype=np.float64):
    """Values in {-1, 0, 1}: ties and zeros are common, so == and != have work to do."""
    return rng.integers(-1, 2, size=shape).astype(dtype)


@given(op=st.sampled_from(sorted(COMPARISONS)), shapes=broadcastable_pairs_with_empty, seed=seeds)
def test_comparisons_are_elementwise_bool_and_record_no_graph(op, shapes, seed):
    rng = np.random.default_rng(seed)
    a = mt.tensor(small_ints(rng, shapes.input_shapes[0]), requires_grad=True)
    b = small_ints(rng, shapes.input_shapes[1])
    expected = COMPARISONS[op](a.data, b)
    for out in (getattr(mt, op)(a, b), OPERATORS[op](a, mt.tensor(b)), getattr(a, op)(b)):
        assert out.dtype == np.bool_ and out.shape == expected.shape and not out.requires_grad and out.is_leaf
        np.testing.assert_array_equal(out.data, expected)
    np.testing.assert_array_equal(OPERATORS[op](a, 0).data, COMPARISONS[op](a.data, 0))  # a number on the right
    np.testing.assert_array_equal(OPERATORS[op](b, a).data, COMPARISONS[op](b, a.data))  # numpy array on the left


@given(shape=shapes_with_empty, dtype=promotion_dtypes, seed=seeds)
def test_logical_and_bitwise_ops(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x, y = small_ints(rng, shape, dtype), small_ints(rng, shape, dtype)
    a, b = mt.tensor(x), mt.tensor(y)
    for name in ("logical_and", "logical_or", "logical_xor"):
        np.testing.assert_array_equal(getattr(mt, name)(a, b).data, getattr(np, name)(x, y))
    np.testing.assert_array_equal(mt.logical_not(a).data, np.logical_not(x))
    if dtype.kind == "f":
        with pytest.raises(TypeError, match="bitwise_and: needs bool or integer"):
            a & b
        return
    np.testing.assert_array_equal((a & b).data, x & y)
    np.testing.assert_array_equal((a | b).data, x | y)
    np.testing.assert_array_equal((a ^ b).data, x ^ y)
    np.testing.assert_array_equal((~a).data, ~x)


def test_isnan_isinf_isfinite_isclose_allclose_equal():
    x = mt.tensor([0.0, np.nan, np.inf, -np.inf, 1.0])
    np.testing.assert_array_equal(mt.isnan(x).data, [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(x.isinf().data, [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(x.isfinite().data, [1, 0, 0, 0, 1])
    assert mt.isnan(mt.tensor([1, 2])).dtype == np.bool_ and mt.isfinite(mt.tensor([1, 2])).data.all()
    np.testing.assert_array_equal(mt.isclose(x, x).data, [1, 0, 1, 1, 1])
    np.testing.assert_array_equal(mt.isclose(x, x, equal_nan=True).data, [1, 1, 1, 1, 1])
    assert mt.allclose(mt.tensor([1.0, 2.0]), mt.tensor([1.0, 2.0 + 1e-7])) is True
    assert mt.allclose(mt.tensor([1.0]), mt.tensor([1.1])) is False
    assert mt.equal(mt.tensor([1, 2]), mt.tensor([1, 2])) and not mt.equal(mt.tensor([1, 2]), mt.tensor([1]))


def test_masked_fill_with_an_elementwise_mask():
    """The issue's case: `==` gave one Python bool, so this filled nothing."""
    x = mt.tensor([0.0, 1.0, 0.0, 2.0], requires_grad=True)
    y = x.masked_fill(x == 0, 5.0)
    np.testing.assert_array_equal(y.data, [5, 1, 5, 2])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [0, 1, 0, 1])
    np.testing.assert_array_equal(mt.tensor([-1.0, 2.0]).masked_fill(mt.tensor([-1.0, 2.0]) > 0, 0.0).data, [-1, 0])


def test_truth_of_a_tensor_as_in_pytorch():
    assert bool(mt.tensor([3.0])) and not bool(mt.tensor(0)) and bool(mt.tensor(2.0) == 2.0)
    assert float(mt.tensor([2.5])) == 2.5 and int(mt.tensor(7)) == 7
    for t in (mt.tensor([1.0, 2.0]), mt.zeros(0)):
        with pytest.raises(RuntimeError, match="ambiguous"):
            bool(t)
    with pytest.raises(RuntimeError, match="ambiguous"):
        assert mt.tensor([1.0, 2.0]) == mt.tensor([1.0, 2.0])


def test_tensors_hash_by_identity():
    a, b = mt.tensor([1.0, 2.0]), mt.tensor([1.0, 2.0])
    assert hash(a) != hash(b) and len({a, b}) == 2 and {a: 1}[a] == 1
    assert (a == None) is False and (a != "a") is True  # noqa: E711  (not a number: Python's own ==)


INTEGER_DTYPES = (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64)


@given(left=st.sampled_from(INTEGER_DTYPES), right=st.sampled_from(INTEGER_DTYPES), zero_dim=st.booleans(),
       seed=seeds)
def test_bitwise_ops_across_integer_dtypes_follow_pytorch_promotion(left, right, zero_dim, seed):
    """The result's dtype is torch.result_type's (a 0-d tensor only counts when it raises the
    category), its values those of the operands cast to that dtype first."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(3,)).astype(left) if left != np.bool_ else rng.random(3) > 0.5
    y = rng.integers(-128, 128, size=() if zero_dim else (3,))
    y = y.astype(right) if right != np.bool_ else y > 0
    raises_category = left == np.bool_ and right != np.bool_
    dtype = mt.promote_types(left, right) if not zero_dim or raises_category else np.dtype(left)
    for op, ufunc in ((lambda a, b: a & b, np.bitwise_and), (lambda a, b: a | b, np.bitwise_or),
                      (lambda a, b: a ^ b, np.bitwise_xor)):
        out = op(mt.tensor(x), mt.tensor(y))
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.data, ufunc(x.astype(dtype), np.asarray(y).astype(dtype)))
    if np.dtype(dtype) != np.bool_:  # shifts by 0..3 bits, in the promoted dtype too
        steps = np.abs(np.asarray(y).astype(dtype)) % 4
        for shifted, ufunc in ((mt.tensor(x) << mt.tensor(steps), np.left_shift),
                               (mt.tensor(x) >> mt.tensor(steps), np.right_shift)):
            np.testing.assert_array_equal(shifted.data, ufunc(x.astype(dtype), steps))


def test_bitwise_ops_with_python_numbers_wrap_as_pytorch():
    """A Python int is weak: the tensor's dtype wins and the number wraps into it (uint8 & -1
    is & 255), never an overflow error."""
    u = mt.tensor([200, 3], dtype=mt.uint8)
    assert (u & -1).dtype == mt.uint8 and (u & -1).data.tolist() == [200, 3]
    assert (mt.tensor([-3, 5], dtype=mt.int8) ^ 300).data.tolist() == [-3 ^ 44, 5 ^ 44]  # 300 wraps to 44
    assert (5 | mt.tensor([2, 3])).data.tolist() == [7, 7] and (mt.tensor([True, False]) & 5).dtype == mt.int64
    assert (mt.tensor([True, False]) ^ True).dtype == mt.bool
    assert (mt.tensor([250], dtype=mt.uint8) + 10).data.tolist() == [4]  # arithmetic wraps alike
