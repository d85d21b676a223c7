"""scatter_reduce (minitensor.scatter_reduction): every reduction, with and without the input's
own values, equals a loop over the index entries; gradients (PyTorch's rules: shares of the
mean, the product of the others even with zeros, ties of amax/amin sharing evenly) equal
central differences; int32 indices work; integer means floor, as PyTorch's."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import scatter_reduce_cases, seeds

import minitensor as mt

REDUCTIONS = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}


def reference(x, dim, index, src, reduce, include_self):
    """out[q] = reduce(x[q] (if included), every src[p] whose along-index lands on q)."""
    landed = {}
    for p in np.ndindex(index.shape):
        q = p[:dim] + (index[p],) + p[dim + 1:]
        landed.setdefault(q, []).append(src[p])
    out = x.copy()
    for q, values in landed.items():
        out[q] = REDUCTIONS[reduce](([x[q]] if include_self else []) + values)
    return out


@given(case=scatter_reduce_cases(), reduce=st.sampled_from(sorted(REDUCTIONS)), include_self=st.booleans(),
       seed=seeds)
def test_scatter_reduce_against_a_loop(case, reduce, include_self, seed):
    shape, dim, index_shape, src_shape = case
    rng = np.random.default_rng(seed)
    x = mt.tensor(rng.standard_normal(shape), requires_grad=True)
    src = mt.tensor(rng.standard_normal(src_shape), requires_grad=True)
    index = rng.integers(0, shape[dim], size=index_shape)
    out = mt.scatter_reduce(x, dim, mt.tensor(index, dtype=mt.int32), src, reduce, include_self=include_self)
    lead = tuple(slice(n) for n in index_shape)
    np.testing.assert_allclose(out.data, reference(x.data, dim % len(shape), index, src.data[lead], reduce,
                                                   include_self), rtol=1e-12)
    assert mt.gradcheck(lambda a, s: a.scatter_reduce(dim, mt.tensor(index), s, reduce, include_self=include_self),
                        x, src)  # normal draws do not tie; the ties' even shares are checked below


def test_scatter_reduce_gradients_through_zeros_and_ties():
    x = mt.tensor(np.array([[0.0, 2.0], [3.0, 0.0]]), requires_grad=True)
    src = mt.tensor(np.array([[0.0, 5.0], [4.0, 1.0], [2.0, 0.0]]), requires_grad=True)
    index = mt.tensor([[0, 0], [0, 1], [1, 1]])
    for include_self in (True, False):
        assert mt.gradcheck(lambda a, s: mt.scatter_reduce(a, 0, index, s, "prod", include_self=include_self), x, src)
    x = mt.tensor(np.array([1.0, 3.0]), requires_grad=True)
    src = mt.tensor(np.array([3.0, 3.0, 0.0]), requires_grad=True)
    mt.scatter_reduce(x, 0, mt.tensor([1, 1, 0]), src, "amax").sum().backward()
    np.testing.assert_allclose(x.grad, [1.0, 1 / 3])  # three contributors tie at 3: a third each
    np.testing.assert_allclose(src.grad, [1 / 3, 1 / 3, 0.0])


def test_scatter_reduce_integer_mean_floors_and_errors_name_the_op():
    x = mt.tensor([[5, 7], [1, 2]])
    np.testing.assert_array_equal(mt.scatter_reduce(x, 0, mt.tensor([[0, 0]]), mt.tensor([[2, 2]]), "mean").data,
                                  [[3, 4], [1, 2]])  # (5 + 2) // 2, (7 + 2) // 2
    with pytest.raises(ValueError, match="reduce must be one of"):
        mt.scatter_reduce(x, 0, mt.tensor([[0]]), x, "max")
    with pytest.raises(IndexError, match="out of range"):
        mt.scatter_reduce(x, 0, mt.tensor([[2]]), x, "sum")
    with pytest.raises(RuntimeError, match="out of range"):  # PyTorch raises RuntimeError here
        mt.scatter_reduce(x, 0, mt.tensor([[2]]), x, "sum")
    with pytest.raises(TypeError, match="index must be an integer tensor"):
        mt.scatter_reduce(x, 0, mt.tensor([[0.0]]), x, "sum")
