"""Shape and indexing ops (minitensor.rearrange, indexing, sorting, shape_ops): forward equals
numpy over 0-d, zero-size and broadcast shapes, backward equals central differences in
float64, and the errors are PyTorch's (IndexError for a dim out of range, ...)."""
import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds, shapes_and_dim, shapes_with_empty

import minitensor as mt
import minitensor.nn.functional as F


def check(fn, reference, *inputs):
    """fn(*inputs) equals reference(*arrays), and its backward central differences."""
    np.testing.assert_array_equal(fn(*inputs).data, reference(*(t.data for t in inputs)))
    assert mt.gradcheck(fn, *inputs)


def test_pytorch_orders_advanced_index_dims():
    x = mt.zeros(2, 3, 4, 5)
    assert x[0, :, [0, 1]].shape == (3, 2, 5)        # numpy: (2, 3, 5)
    assert x[:, [0, 1], 0].shape == (2, 2, 5)
    assert x[[0, 1], :, [0, 1]].shape == (2, 3, 5)  # separated advanced indices go first
    assert x[1, ..., [2, 3]].shape == (3, 4, 2)


@given(seed=seeds)
def test_getitem_with_ints_and_arrays_differentiates(seed):
    x = leaf(np.random.default_rng(seed), (2, 3, 4))
    check(lambda x: x[1, :, [0, 0, 3]], lambda a: np.moveaxis(a[1][:, [0, 0, 3]], 0, 0), x)


def test_cat_stack_split_check_their_dims():
    x = mt.zeros(2, 3)
    with pytest.raises(IndexError, match="stack: dim 77 is out of range"):
        mt.stack([x], axis=77)
    with pytest.raises(IndexError, match="cat: dim 5 is out of range"):
        mt.concat([x, x], axis=5)
    with pytest.raises(ValueError, match="0-d tensor cannot be concatenated"):
        mt.cat([mt.tensor(1.0), mt.tensor(2.0)])
    with pytest.raises(TypeError, match="give one"):
        mt.cat([x], dim=0, axis=0)
    with pytest.raises(IndexError, match="split: dim 2"):
        x.split(1, dim=2)
    assert mt.cat([x, x], dim=-1).shape == (2, 6) and mt.stack([x, x], dim=-1).shape == (2, 3, 2)
    assert [t.shape for t in x.split(2, dim=1)] == [(2, 2), (2, 1)] and len(mt.zeros(0).split(2)) == 1


@given(shape_dim=shapes_and_dim(), seed=seeds)
def test_cat_stack_split_chunk_over_zero_size_shapes(shape_dim, seed):
    shape, dim = shape_dim
    x, y = leaf(np.random.default_rng(seed), shape), leaf(np.random.default_rng(seed + 1), shape)
    check(lambda a, b: mt.cat([a, b], dim=dim), lambda a, b: np.concatenate([a, b], dim), x, y)
    check(lambda a, b: mt.stack([a, b], dim=dim), lambda a, b: np.stack([a, b], dim), x, y)
    pieces = x.chunk(2, dim)
    np.testing.assert_array_equal(np.concatenate([p.data for p in pieces], dim), x.data)
    assert len(pieces) <= 2


@given(shape=shapes_with_empty, seed=seeds)
def test_flip_roll_clone_tile_over_any_shape(shape, seed):
    x = leaf(np.random.default_rng(seed), shape)
    dims = tuple(range(x.ndim))
    check(lambda a: a.flip(dims), lambda a: np.flip(a, dims), x)
    check(lambda a: a.roll(2), lambda a: np.roll(a, 2), x)
    check(lambda a: mt.clone(a), lambda a: a, x)
    check(lambda a: a.repeat(2, *(1,) * a.ndim), lambda a: np.tile(a, (2,) + (1,) * a.ndim), x)
    check(lambda a: a.expand(2, *a.shape), lambda a: np.broadcast_to(a, (2,) + a.shape), x)
    if x.ndim:
        check(lambda a: a.roll((1, -1), (0, -1)), lambda a: np.roll(a, (1, -1), (0, -1)), x)
        check(lambda a: a.unflatten(0, (1, -1)), lambda a: a.reshape((1,) + a.shape), x)
    if x.ndim >= 2:
        check(lambda a: mt.tril(a, -1) + a.triu(1), lambda a: np.tril(a, -1) + np.triu(a, 1), x)


def test_shape_op_errors():
    x = mt.zeros(2, 3)
    with pytest.raises(ValueError, match="can only grow from 1"):
        x.expand(4, 3, 3)
    with pytest.raises(ValueError, match="repeat counts"):
        x.repeat(2)
    with pytest.raises(ValueError, match="at least 2 dims"):
        mt.zeros(3).tril()
    with pytest.raises(IndexError, match="flip: dim 2"):
        x.flip(2)
    with pytest.raises(ValueError, match="unflatten"):
        x.unflatten(1, (2, 2))
    assert x.expand(-1, 3).shape == (2, 3) and x.contiguous() is x and x.T.contiguous().data.flags.c_contiguous


@given(shape_dim=shapes_and_dim(), seed=seeds)
def test_gather_scatter_index_select_against_numpy(shape_dim, seed):
    shape, dim = shape_dim
    rng = np.random.default_rng(seed)
    x = leaf(rng, shape)
    index = rng.integers(0, max(shape[dim], 1), size=shape) if shape[dim] else np.zeros(shape, np.int64)
    index = mt.tensor(index.astype(np.int64))
    check(lambda a: a.gather(dim, index), lambda a: np.take_along_axis(a, index.data, dim), x)
    src = leaf(rng, shape)
    expected = x.data.copy()
    np.put_along_axis(expected, index.data, src.data, dim)
    np.testing.assert_array_equal(x.scatter(dim, index, src).data, expected) if len(set(
        index.data.reshape(-1).tolist())) == index.size else None
    assert mt.gradcheck(lambda a, s: a.scatter_add(dim, index, s), x, src)
    added = x.data.copy()
    np.add.at(added, tuple(np.ogrid[tuple(slice(n) for n in shape)][:dim % len(shape)]) + (index.data,)
              + tuple(np.ogrid[tuple(slice(n) for n in shape)][dim % len(shape) + 1:]), src.data)
    np.testing.assert_allclose(x.scatter_add(dim, index, src).data, added)
    picks = mt.tensor(rng.integers(0, max(shape[dim], 1), size=2 if shape[dim] else 0).astype(np.int64))
    check(lambda a: a.index_select(dim, picks), lambda a: np.take(a, picks.data, dim), x)


def test_scatter_gradient_skips_overwritten_entries():
    x = mt.tensor(np.zeros((2, 3)), requires_grad=True)
    src = mt.tensor(np.ones((1, 2)), requires_grad=True)
    y = x.scatter(1, mt.tensor([[2, 0]]), src)
    np.testing.assert_array_equal(y.data, [[1, 0, 1], [0, 0, 0]])
    assert mt.gradcheck(lambda a, s: a.scatter(1, mt.tensor([[2, 0]]), s), x, src)
    assert mt.scatter(mt.zeros(3), 0, mt.tensor([1]), value=5.0).data.tolist() == [0, 5, 0]


def test_index_errors_are_pytorchs():
    x = mt.zeros(2, 3)
    with pytest.raises(IndexError, match="out of range"):
        x.gather(1, mt.tensor([[3]]))
    with pytest.raises(RuntimeError, match="out of range"):  # PyTorch's class for it, too
        x.gather(1, mt.tensor([[3]]))
    with pytest.raises(TypeError, match="index must be an integer tensor"):
        x.gather(1, mt.tensor(np.array([[0.0]])))
    with pytest.raises(ValueError, match="same number of dims"):
        x.gather(1, mt.tensor([0]))
    with pytest.raises(ValueError, match="must be smaller than num_classes"):
        F.one_hot(mt.tensor([3]), 3)
    with pytest.raises(ValueError, match="non-negative"):
        F.one_hot(mt.tensor([-1]))
    with pytest.raises(TypeError, match="bool"):
        x.masked_select(mt.tensor([1, 0, 1]))


@given(shape=shapes_with_empty, seed=seeds)
def test_masked_select_and_one_hot(shape, seed):
    rng = np.random.default_rng(seed)
    x = leaf(rng, shape)
    mask = mt.tensor(rng.random(shape[-1:]) > 0.5)
    check(lambda a: a.masked_select(mask), lambda a: a[np.broadcast_to(mask.data, a.shape)], x)
    labels = mt.tensor(rng.integers(0, 4, size=shape).astype(np.int64))
    np.testing.assert_array_equal(F.one_hot(labels, 4).data, np.eye(4, dtype=np.int64)[labels.data])
    assert F.one_hot(labels, 4).dtype == np.int64 and not F.one_hot(labels, 4).requires_grad


def test_item_and_masked_assignment_are_differentiable():
    def assign(a, v):
        y = a * 1.0
        y[0, [1, 2]] = v
        y[y > 0.5] = 0.0
        return y
    rng = np.random.default_rng(0)
    x, v = leaf(rng, (3, 4)), leaf(rng, (2,))
    expected = x.data.copy()
    expected[0, [1, 2]] = v.data
    expected[expected > 0.5] = 0
    np.testing.assert_array_equal(assign(x, v).data, expected)
    assert mt.gradcheck(assign, x, v)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x[0] = 1.0
    z = mt.zeros(2, 3, 4)
    z[0, :, [0, 1]] = mt.ones(3, 2)  # PyTorch's dim order when writing, too
    assert z.data[0, :, :2].all() and z.data.sum() == 6


@given(shape_dim=shapes_and_dim(), descending=st.booleans(), seed=seeds)
def test_sort_argsort_topk_against_numpy(shape_dim, descending, seed):
    shape, dim = shape_dim
    rng = np.random.default_rng(seed)
    x = mt.tensor(rng.integers(-2, 3, size=shape).astype(np.float64), requires_grad=True)  # ties
    values, indices = x.sort(dim, descending=descending)
    order = np.argsort(-x.data if descending else x.data, dim, kind="stable")
    np.testing.assert_array_equal(indices.data, order)  # ties keep their order, as stable=True
    np.testing.assert_array_equal(values.data, np.take_along_axis(x.data, order, dim))
    np.testing.assert_array_equal(mt.argsort(x, dim, descending=descending).data, order)
    k = shape[dim] // 2
    top = x.topk(k, dim)
    np.testing.assert_array_equal(top.values.data, np.take_along_axis(x.data, np.argsort(-x.data, dim,
                                  kind="stable"), dim).take(range(k), dim))
    x.data += rng.standard_normal(shape) * 1e-3  # no ties for the finite differences
    assert mt.gradcheck(lambda a: a.sort(dim, descending=descending).values * 1.0, x)
    with pytest.raises(IndexError, match="topk: k"):
        x.topk(shape[dim] + 1, dim)


def test_zero_dim_tensors_through_the_ops():
    x = mt.tensor(np.float64(2.0), requires_grad=True)
    assert x.sort().values.shape == () and x.argsort().item() == 0 and x.topk(1).values.item() == 2.0
    assert x.flip(0).shape == () and x.roll(1).shape == () and x.roll(1, 0).shape == ()
    assert x.expand(3).data.tolist() == [2, 2, 2] and x.repeat(2, 2).shape == (2, 2)
    assert x.index_select(0, mt.tensor([0, 0])).shape == (2,)


def test_matmul_and_dot_with_one_dim_operands():
    rng = np.random.default_rng(1)
    a, m, b = leaf(rng, (3,)), leaf(rng, (2, 3, 4)), leaf(rng, (4,))
    check(lambda a, m: a @ m, lambda a, m: a @ m, a, m)
    check(lambda m, b: m @ b, lambda m, b: m @ b, m, b)
    check(lambda a, c: a @ c, lambda a, c: a @ c, a, leaf(rng, (3,)))


@given(shape_dim=shapes_and_dim(), seed=seeds)
def test_gather_and_scatter_take_int32_indices(shape_dim, seed):
    """PyTorch 2 accepts int32 indices: the same answer and gradient as int64."""
    shape, dim = shape_dim
    rng = np.random.default_rng(seed)
    x = leaf(rng, shape)
    index = rng.integers(0, max(shape[dim], 1), size=shape) if shape[dim] else np.zeros(shape, np.int64)
    wide, narrow = mt.tensor(index), mt.tensor(index.astype(np.int32))
    np.testing.assert_array_equal(x.gather(dim, narrow).data, x.gather(dim, wide).data)
    src = leaf(rng, shape)
    for op in (mt.scatter, mt.scatter_add):
        np.testing.assert_array_equal(op(x, dim, narrow, src).data, op(x, dim, wide, src).data)
    assert mt.gradcheck(lambda a: a.gather(dim, narrow), x)


@given(shape=shapes_with_empty, shift=st.integers(-4, 4), seed=seeds)
def test_roll_of_one_shift_without_dims_rolls_the_flattened_tensor(shape, shift, seed):
    x = leaf(np.random.default_rng(seed), shape)
    for shifts in (shift, (shift,), [shift]):
        check(lambda a: mt.roll(a, shifts=shifts), lambda a: np.roll(a, shift), x)
    with pytest.raises(ValueError, match="without dims, shifts must be one int"):
        mt.roll(x, (1, 2))


@given(n=st.integers(17, 80), dims=st.integers(1, 2), descending=st.booleans(), seed=seeds)
def test_sort_is_stable_by_default_on_long_rows(n, dims, descending, seed):
    """Ties keep their order with or without stable=True (numpy's default quicksort would not
    keep it past 16 elements): PyTorch's stable=True order, the default here."""
    rng = np.random.default_rng(seed)
    x = mt.tensor(rng.integers(0, 3, size=(2,) * (dims - 1) + (n,)).astype(np.float32))
    order = np.argsort(-x.data if descending else x.data, -1, kind="stable")
    for stable in (False, True):
        np.testing.assert_array_equal(x.sort(descending=descending, stable=stable).indices.data, order)
        np.testing.assert_array_equal(mt.argsort(x, descending=descending, stable=stable).data, order)


def test_stack_never_wraps_a_dim_one_past_the_end():
    x = mt.ones(2, 3)
    assert mt.stack([x, x], dim=2).shape == (2, 3, 2) and mt.stack([x, x], dim=-3).shape == (2, 2, 3)
    for dim in (3, -4):
        with pytest.raises(IndexError, match=f"stack: dim {dim} is out of range \\[-3, 3\\)"):
            mt.stack([x, x], dim=dim)
