"""Reductions and scans with PyTorch's arguments (minitensor.reductions, statistics, scans):
min/max with dim, argmax/argmin, prod, any/all, var/std, logsumexp, cumsum/cumprod. Forward
equals numpy over 0-d, zero-size and keepdim cases; backward equals central differences
(gradcheck, float64); the empty cases and errors follow PyTorch."""
import warnings

import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds, shapes_and_dims

import minitensor as mt


def reduced_sizes(shape, dim):
    axes = range(len(shape)) if dim is None else [dim] if isinstance(dim, int) else dim
    return [shape[a] for a in axes] if shape else []


def reference(name, x, dim, keepdim):
    """numpy's answer for a PyTorch reduction over `dim` (numpy's axis=0 on a 0-d array fails)."""
    axis = None if x.ndim == 0 else dim
    fn = {"amax": np.amax, "amin": np.amin, "sum": np.sum, "mean": np.mean, "any": np.any, "all": np.all,
          "var": lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims, ddof=1),
          "std": lambda x, axis, keepdims: np.std(x, axis=axis, keepdims=keepdims, ddof=1),
          "logsumexp": lambda x, axis, keepdims: np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))}[name]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns of the empty and n−1 = 0 cases
        return np.asarray(fn(x, axis=axis, keepdims=keepdim))


@pytest.mark.parametrize("name", ["amax", "amin", "sum", "mean", "var", "std", "logsumexp", "any", "all"])
@given(shape_dim=shapes_and_dims(), keepdim=st.booleans(), seed=seeds)
def test_reductions_over_dims(name, shape_dim, keepdim, seed):
    shape, dim = shape_dim
    empty = 0 in reduced_sizes(shape, dim)
    if name in ("amax", "amin") and empty:
        return  # an error, checked below
    x = leaf(np.random.default_rng(seed), shape)
    out = getattr(mt, name)(x, dim, keepdim=keepdim)  # var(x, dim, unbiased, keepdim): keepdim by name
    expected = reference(name, x.data, dim, keepdim)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.data, expected, rtol=1e-10, atol=1e-12)
    too_few = name in ("var", "std") and np.prod(reduced_sizes(shape, dim)) < 2  # n − 1 = 0: NaN, as in PyTorch
    if name not in ("any", "all") and x.size and not too_few:
        assert mt.gradcheck(lambda x: getattr(mt, name)(x, dim, keepdim=keepdim), x)


@pytest.mark.parametrize("name", ["max", "min"])
@given(shape_dim=shapes_and_dims(tuples=False), keepdim=st.booleans(), seed=seeds)
def test_max_and_min_over_one_dim_give_values_and_indices(name, shape_dim, keepdim, seed):
    shape, dim = shape_dim
    if dim is None or 0 in reduced_sizes(shape, dim):
        return
    x = leaf(np.random.default_rng(seed), shape)
    values, indices = getattr(x, name)(dim, keepdim)  # positional dim, as x.max(1) in PyTorch
    axis = None if x.ndim == 0 else dim
    arg = {"max": np.argmax, "min": np.argmin}[name]
    np.testing.assert_array_equal(indices.data, arg(x.data, axis=axis, keepdims=keepdim))
    np.testing.assert_array_equal(values.data, getattr(np, "a" + name)(x.data, axis=axis, keepdims=keepdim))
    assert indices.dtype == np.int64 and not indices.requires_grad
    assert mt.gradcheck(lambda x: getattr(x, name)(dim, keepdim).values, x)
    np.testing.assert_array_equal(getattr(mt, "arg" + name)(x, dim, keepdim).data, indices.data)


def test_ties_follow_pytorch():
    x = mt.tensor(np.array([[1.0, 3.0, 3.0]]), requires_grad=True)
    x.max().backward()  # a full max shares the gradient among the ties
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5]])
    x.grad = None
    x.max(1).values.sum().backward()  # max(dim) gives it to the index it returns: the first
    np.testing.assert_array_equal(x.grad, [[0, 1, 0]])
    assert x.argmax().item() == 1 and x.argmin(1).data.tolist() == [0]


@given(shape_dim=shapes_and_dims(tuples=False), keepdim=st.booleans(), seed=seeds, zeros=st.integers(0, 2))
def test_prod_with_zeros(shape_dim, keepdim, seed, zeros):
    shape, dim = shape_dim
    rng = np.random.default_rng(seed)
    x = leaf(rng, shape)
    x.data.reshape(-1)[rng.integers(0, max(x.size, 1), size=zeros if x.size else 0)] = 0.0  # exact zeros
    out = mt.prod(x, dim, keepdim) if dim is not None else mt.prod(x)
    axis = None if x.ndim == 0 else dim
    np.testing.assert_allclose(out.data, np.prod(x.data, axis=axis, keepdims=keepdim and dim is not None))
    assert mt.gradcheck(lambda x: mt.prod(x, dim, keepdim) if dim is not None else x.prod(), x)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@given(shape_dim=shapes_and_dims(tuples=False), seed=seeds, zero=st.booleans())
def test_scans(name, shape_dim, seed, zero):
    shape, dim = shape_dim
    dim = 0 if dim is None else dim
    rng = np.random.default_rng(seed)
    x = leaf(rng, shape)
    if zero and x.size:
        x.data.reshape(-1)[rng.integers(0, x.size)] = 0.0
    out = getattr(x, name)(dim)
    np.testing.assert_allclose(out.data, getattr(np, name)(x.data.reshape(shape or (1,)), axis=dim).reshape(shape))
    assert mt.gradcheck(lambda x: getattr(mt, name)(x, dim), x)


def test_dtypes_of_reductions_follow_pytorch():
    ints, bools = mt.tensor([[1, 2], [3, 4]], dtype=mt.int32), mt.tensor([True, True, False])
    assert ints.sum().dtype == bools.sum().dtype == ints.prod().dtype == ints.cumsum(0).dtype == np.int64
    assert bools.sum().item() == 2 and ints.sum(dtype=mt.float64).dtype == np.float64
    assert ints.var().dtype == ints.logsumexp(0).dtype == np.float32
    assert mt.tensor([1.0, 2.0, 4.0]).var(correction=0).item() == pytest.approx(np.var([1, 2, 4]))
    assert mt.tensor([1.0, 2.0, 4.0]).std(unbiased=False).item() == pytest.approx(np.std([1, 2, 4]))
    with pytest.raises(TypeError, match="mean: needs a floating dtype, got int32"):
        ints.mean()
    assert ints.mean(dtype=mt.float32).item() == 2.5


def test_empty_reductions_follow_pytorch():
    """The issue's case: mean over an empty dim raised ZeroDivisionError; PyTorch gives NaN."""
    empty = mt.zeros(3, 0)
    assert np.isnan(empty.mean().item()) and np.isnan(empty.mean(1).data).all() and empty.mean(0).shape == (0,)
    assert empty.sum().item() == 0 and empty.prod().item() == 1
    assert mt.logsumexp(empty, 1).data.tolist() == [-np.inf] * 3
    assert empty.max(0).values.shape == (0,) and empty.any().item() is False and empty.all().item() is True
    for fn in (lambda: empty.max(), lambda: empty.max(1), lambda: empty.argmin(), lambda: mt.amax(empty, 1)):
        with pytest.raises(IndexError, match="cannot reduce over an empty dim"):
            fn()
    with pytest.raises(IndexError, match="axis 2 is out of range for a tensor of shape \\(3, 0\\)"):
        empty.sum(2)


def running_extreme_reference(x, axis, moves):
    """Loops: the running max (min) along `axis` and the LAST index holding it (PyTorch's
    cummax / cummin: a tie moves the index on; a NaN wins and stays)."""
    x = np.moveaxis(x, axis, -1)
    values, indices = np.empty_like(x), np.zeros(x.shape, np.int64)
    for row in np.ndindex(x.shape[:-1]):
        best, where = None, 0
        for i, v in enumerate(x[row]):
            if best is None or np.isnan(v) or (not np.isnan(best) and moves(v, best)):
                best, where = v, i
            values[row + (i,)], indices[row + (i,)] = best, where
    return np.moveaxis(values, -1, axis), np.moveaxis(indices, -1, axis)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@given(shape_dim=shapes_and_dims(tuples=False), seed=seeds, nan=st.booleans())
def test_cummax_cummin_against_loops(name, shape_dim, seed, nan):
    shape, dim = shape_dim
    dim = 0 if dim is None else dim
    rng = np.random.default_rng(seed)
    ties = rng.integers(-2, 3, size=shape).astype(np.float64)
    if nan and ties.size:
        ties.reshape(-1)[rng.integers(0, ties.size)] = np.nan
    moves = np.greater_equal if name == "cummax" else np.less_equal  # a tie moves the index on
    values, indices = getattr(mt.tensor(ties), name)(dim)
    expected_values, expected_indices = running_extreme_reference(ties.reshape(shape or (1,)), dim, moves)
    np.testing.assert_array_equal(values.data, expected_values.reshape(shape))
    np.testing.assert_array_equal(indices.data, expected_indices.reshape(shape))
    x = leaf(rng, shape)  # no ties: the running extreme moves by steps the finite differences do not cross
    assert mt.gradcheck(lambda x: getattr(mt, name)(x, dim).values, x)


def test_cummax_sends_each_gradient_to_the_index_it_returns():
    x = mt.tensor(np.array([1.0, 3.0, 2.0, 3.0, 0.0]), requires_grad=True)
    values, indices = mt.cummax(x, 0)
    assert indices.data.tolist() == [0, 1, 1, 3, 3] and indices.dtype == mt.int64
    values.sum().backward()
    np.testing.assert_array_equal(x.grad, [1, 2, 0, 2, 0])


def test_dtype_argument_of_sums_products_and_scans():
    ints = mt.tensor([[1, 2], [3, 4]], dtype=mt.int32)
    for name in ("sum", "prod"):
        out = getattr(mt, name)(ints, dtype=mt.float64)
        assert out.dtype == mt.float64 and out.item() == getattr(np, name)(ints.data)
    for name in ("cumsum", "cumprod"):
        out = getattr(ints, name)(1, dtype=mt.float32)
        assert out.dtype == mt.float32
        np.testing.assert_array_equal(out.data, getattr(np, name)(ints.data, axis=1))
    x = mt.tensor(np.array([1.5, 2.0]), requires_grad=True)
    mt.cumprod(x, 0, dtype=mt.float64).sum().backward()  # a float dtype keeps the graph
    np.testing.assert_array_equal(x.grad, [1 + 2.0, 1.5])
