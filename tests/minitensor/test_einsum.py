"""einsum (minitensor.einsum): forward equals numpy's einsum over drawn equations (diagonals,
broadcast size-1 dims, `...`, implicit outputs, letters summed within one operand), the
gradient of every operand equals central differences, and a bad equation is one line."""
import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from strategies import einsum_cases, seeds

import minitensor as mt


@given(case=einsum_cases(), seed=seeds)
def test_einsum_equals_numpy_and_its_gradient_central_differences(case, seed):
    equation, shapes = case
    rng = np.random.default_rng(seed)
    xs = [leaf(rng, s) for s in shapes]
    out = mt.einsum(equation, *xs)
    np.testing.assert_allclose(out.data, np.einsum(equation, *(x.data for x in xs)), rtol=1e-12, atol=1e-12)
    assert mt.gradcheck(lambda *a: mt.einsum(equation, *a), *xs)


def test_einsum_names_the_usual_products():
    rng = np.random.default_rng(0)
    a, b, v = leaf(rng, (2, 3)), leaf(rng, (3, 4)), leaf(rng, (3,))
    np.testing.assert_allclose(mt.einsum("ij,jk->ik", a, b).data, a.data @ b.data)
    np.testing.assert_allclose(mt.einsum("ij,jk", [a, b]).data, a.data @ b.data)  # operands as one list
    np.testing.assert_allclose(mt.einsum("ji", a).data, a.data.T)  # implicit output: letters in order
    square = leaf(rng, (3, 3))
    assert mt.einsum("ii", square).item() == pytest.approx(np.trace(square.data))
    np.testing.assert_allclose(mt.einsum("i,j->ij", v, v).data, np.outer(v.data, v.data))
    assert mt.einsum("ij,j->i", mt.tensor([[1, 2], [3, 4]]), mt.tensor([1, 1])).dtype == mt.int64


def test_einsum_errors_name_the_equation():
    a = mt.ones(2, 3)
    with pytest.raises(ValueError, match="the letter 'j' has sizes 3 and 2"):
        mt.einsum("ij,jk", a, a)
    with pytest.raises(RuntimeError, match="the letter 'j' has sizes 3 and 2"):  # PyTorch's class too
        mt.einsum("ij,jk", a, a)
    with pytest.raises(ValueError, match="needs at least one operand"):
        mt.einsum("->")
    with pytest.raises(ValueError, match="names 2 operands, got 1"):
        mt.einsum("ij,jk", a)
    with pytest.raises(ValueError, match="does not fit an operand of 2 dims"):
        mt.einsum("ijk", a)
    with pytest.raises(ValueError, match="repeats a letter or names one no input has"):
        mt.einsum("ij->k", a)
    with pytest.raises(ValueError, match="repeated letter 'i' of 'ii' spans dims of sizes"):
        mt.einsum("ii", a)
    with pytest.raises(TypeError, match="dtypes"):
        mt.einsum("i,i", mt.ones(2), mt.ones(2, dtype=mt.float64))
