"""Division rounded to an integer, remainders and copysign (minitensor.binary_math): values
against numpy's floor division / trunc / remainder / fmod / copysign over broadcast shapes
and dtype mixes, PyTorch's dtypes (integers stay integers when rounded, copysign computes in
float), PyTorch's gradients (0 for a rounded quotient; 1 and −q through a remainder; ±1
through copysign, 0 at a = 0) by central differences."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import broadcastable_pairs_with_empty, promotion_dtypes, seeds

import minitensor as mt


def draw(rng, shape, dtype, nonzero=False):
    values = rng.integers(-9, 10, size=shape)
    if nonzero:
        values = np.where(values == 0, 3, values)
    return values.astype(dtype) if dtype != np.bool_ else (values > 0)


def trunc_reference(a, b):
    """a / b toward zero, exactly for integers: sign times |a| // |b|."""
    if np.result_type(a, b).kind == "f":
        return np.trunc(a / b)
    return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))


@given(shapes=broadcastable_pairs_with_empty, left=promotion_dtypes, right=promotion_dtypes, seed=seeds)
def test_rounded_division_against_numpy(shapes, left, right, seed):
    if {left, right} == {np.dtype(np.float32), np.dtype(np.float64)}:
        return  # this engine refuses to mix float32 with float64 (README)
    rng = np.random.default_rng(seed)
    a = mt.tensor(draw(rng, shapes.input_shapes[0], left))
    b = mt.tensor(draw(rng, shapes.input_shapes[1], right, nonzero=True))
    b = b if right != np.bool_ else mt.tensor(np.ones(b.shape, bool))  # a bool divisor must be True
    dtype = mt.promote_types(left, right)
    x, y = a.data.astype(dtype if dtype != np.bool_ else np.int64), b.data.astype(dtype if dtype != np.bool_ else np.int64)
    floor, trunc = mt.div(a, b, rounding_mode="floor"), a.div(b, rounding_mode="trunc")
    assert floor.dtype == trunc.dtype == (dtype if dtype != np.bool_ else np.int64)  # PyTorch's: no float for ints
    np.testing.assert_array_equal(floor.data, np.floor_divide(x, y))
    np.testing.assert_array_equal((a // b).data, np.floor_divide(x, y))
    np.testing.assert_array_equal(trunc.data, trunc_reference(x, y))
    for ours, numpys in ((a % b, np.remainder), (mt.remainder(a, b), np.remainder), (mt.fmod(a, b), np.fmod)):
        assert ours.dtype == floor.dtype
        np.testing.assert_array_equal(ours.data, numpys(x, y))


def test_rounded_division_gradient_is_zero_and_errors_are_pytorchs():
    a = mt.tensor(np.array([-7.5, 7.5, 2.2]), requires_grad=True)  # off the steps
    assert mt.gradcheck(lambda a: mt.div(a, 2.0, rounding_mode="floor") + a, a)  # flat steps: only `+ a` counts
    np.testing.assert_array_equal(mt.div(a, 2, rounding_mode="trunc").data, [-3, 3, 1])
    np.testing.assert_array_equal(mt.div(mt.tensor([-7, 7]), 2, rounding_mode="floor").data, [-4, 3])
    np.testing.assert_array_equal(mt.div(mt.tensor([-7, 7, -6, 6]), mt.tensor([2, -2, 4, 3]), rounding_mode="trunc").data,
                                  [-3, -3, -1, 2])  # integers toward zero, exactly
    np.testing.assert_array_equal((7 // mt.tensor([2, -2])).data, [3, -4])
    with pytest.raises(ValueError, match="rounding_mode must be None, 'trunc' or 'floor', got 'round'"):
        mt.div(a, 2, rounding_mode="round")
    with pytest.raises(ZeroDivisionError, match="integer division by zero"):
        mt.div(mt.tensor([1]), 0, rounding_mode="trunc")
    with pytest.raises(RuntimeError, match="integer division by zero"):  # PyTorch raises RuntimeError
        mt.tensor([1]) // mt.tensor([0])


@given(shapes=broadcastable_pairs_with_empty, seed=seeds, integer=st.booleans())
def test_copysign_against_numpy(shapes, seed, integer):
    rng = np.random.default_rng(seed)
    a = mt.tensor(rng.standard_normal(shapes.input_shapes[0]), requires_grad=True)
    b = rng.standard_normal(shapes.input_shapes[1])
    if integer:
        ints = mt.tensor(rng.integers(-3, 4, shapes.input_shapes[0]))
        assert mt.copysign(ints, -1).dtype == mt.float32  # integers compute in float, as in PyTorch
        np.testing.assert_array_equal(mt.copysign(ints, -1).data, -np.abs(ints.data))
    np.testing.assert_array_equal(mt.copysign(a, b).data, np.copysign(a.data, b))
    assert mt.gradcheck(lambda a, b: a.copysign(b), a, mt.tensor(b, requires_grad=True))


def test_copysign_takes_the_sign_bit_and_its_gradient_is_zero_at_zero():
    a = mt.tensor(np.array([0.0, 2.0, -3.0]), requires_grad=True)
    out = mt.copysign(a, mt.tensor(np.array([-1.0, -0.0, 0.0])))
    np.testing.assert_array_equal(out.data, [-0.0, -2.0, 3.0])
    assert np.signbit(out.data[0])
    out.sum().backward()
    np.testing.assert_array_equal(a.grad, [0.0, -1.0, -1.0])


@given(shapes=broadcastable_pairs_with_empty, seed=seeds)
def test_remainder_and_fmod_gradients(shapes, seed):
    rng = np.random.default_rng(seed)
    a = mt.tensor(rng.uniform(-9, 9, shapes.input_shapes[0]), requires_grad=True)
    b = mt.tensor(rng.uniform(0.5, 3, shapes.input_shapes[1]) * rng.choice([-1, 1], shapes.input_shapes[1]),
                  requires_grad=True)  # quotients off the integers with probability 1: off the jumps
    for op in (mt.remainder, mt.fmod, lambda a, b: a % b):
        assert mt.gradcheck(op, a, b)
    assert (7 % mt.tensor([3, -3])).data.tolist() == [1, -2] and mt.fmod(mt.tensor([-7]), 3).item() == -1
