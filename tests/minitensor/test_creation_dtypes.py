"""Creation functions, dtype casts and PyTorch's type promotion (minitensor.creation,
methods, promotion), and the issue's regressions: tensor(2).exp() in float32, zero-size
matmul forward and backward, softmax of a 0-d tensor, where with two numbers."""
import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from strategies import matmul_shapes, promotion_dtypes, seeds

import minitensor as mt
import minitensor.nn.functional as F

# torch.result_type for (left, right) operands; "t:" a tensor of ≥ 1 dim, "0:" a 0-d tensor.
PROMOTIONS = [
    ("t:int64", 2.5, "float32"), ("t:int32", 7, "int32"), ("t:float16", 2.5, "float16"), ("t:bool", 1, "int64"),
    ("t:bool", True, "bool"), ("t:float32", "0:float64", "float32"), ("t:int64", "0:float64", "float64"),
    ("t:int8", "0:int64", "int8"), ("t:int32", "t:int64", "int64"), ("t:int32", "t:float16", "float16"),
    ("t:uint8", "t:int8", "int16"), ("0:int32", "0:float64", "float64"), ("0:int64", 2.5, "float32"),
    ("t:bool", "0:float64", "float64"), ("t:int32", "0:bool", "int32"),
]


def operand(spec):
    if not isinstance(spec, str):
        return spec
    kind, dtype = spec.split(":")
    return mt.tensor(np.ones(() if kind == "0" else (2,), dtype))


@pytest.mark.parametrize("left, right, expected", PROMOTIONS)
def test_promotion_follows_torch_result_type(left, right, expected):
    a, b = operand(left), operand(right)
    assert (a + b).dtype == expected and (b * a).dtype == expected
    assert mt.where(np.array([True, False]), a, b).dtype == expected


@given(left=promotion_dtypes, right=promotion_dtypes)
def test_promotion_of_two_tensors_is_symmetric_and_keeps_each_category(left, right):
    a, b = mt.tensor(np.ones(2, left)), mt.tensor(np.ones(2, right))
    if left.kind == right.kind == "f" and left != right:
        with pytest.raises(TypeError, match="dtypes .* differ; convert one explicitly"):
            a + b  # this project's one rule beyond PyTorch's: no silent float32 → float64
        return
    out = mt.promote_types(left, right)
    assert (a * b).dtype == (b * a).dtype == mt.where(np.array([True, False]), a, b).dtype == out
    assert out == max(left, right, key=lambda d: ({"b": 0, "i": 1, "f": 2}[d.kind], d.itemsize))


def test_integer_division_and_float_only_ops_compute_in_float32():
    assert (mt.tensor([1, 2]) / 2).dtype == mt.float32 and (mt.tensor([3]) / mt.tensor([2])).item() == 1.5
    assert mt.tensor(2).exp().dtype == mt.float32  # the case: it was float64
    assert mt.tensor(2).dtype == mt.int64 and mt.tensor(2.0).dtype == mt.float32 and mt.tensor(True).dtype == mt.bool
    for fn in (mt.exp, mt.log, mt.sqrt, mt.tanh, mt.sigmoid, mt.sin):
        assert fn(mt.tensor([1, 2])).dtype == mt.float32


def test_casts_with_pytorch_names():
    x = mt.tensor([1.7, -0.5, 0.0], requires_grad=True)
    assert x.long().dtype == mt.int64 and x.long().data.tolist() == [1, 0, 0] and not x.long().requires_grad
    assert x.int().dtype == mt.int32 and x.bool().data.tolist() == [True, True, False]
    assert x.half().dtype == mt.float16 and x.double().dtype == mt.float64 and x.float() is x
    x.half().float().sum().backward()  # a float cast is differentiable
    np.testing.assert_array_equal(x.grad, [1, 1, 1])
    assert mt.tensor([1, 2]).sum(dtype=mt.float32).dtype == mt.float32


def test_creation_functions():
    mt.manual_seed(0)
    assert mt.full((2, 3), 7).dtype == mt.int64 and mt.full((2,), 1.5).dtype == mt.float32
    assert mt.full([2], True).dtype == mt.bool and mt.full((2,), 1, dtype=mt.float64).data.tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(mt.eye(2, 3).data, np.eye(2, 3)) and mt.eye(3).dtype == mt.float32
    np.testing.assert_allclose(mt.linspace(0, 1, 5).data, [0, 0.25, 0.5, 0.75, 1])
    assert mt.empty(2, 0).shape == (2, 0) and mt.zeros(()).shape == ()
    r = mt.rand(1000)
    assert r.dtype == mt.float32 and 0 <= r.data.min() and r.data.max() < 1
    i = mt.randint(3, 7, (1000,))
    assert i.dtype == mt.int64 and set(i.data.tolist()) == {3, 4, 5, 6}
    assert mt.randint(5, (2, 2)).shape == (2, 2)
    x = mt.tensor(np.ones((2, 3), np.float64))
    for like in (mt.zeros_like, mt.ones_like, mt.empty_like, mt.rand_like, mt.randn_like):
        assert like(x).shape == (2, 3) and like(x).dtype == mt.float64
    assert mt.full_like(x, 4).data.tolist() == [[4.0] * 3] * 2 and mt.ones_like(x, dtype=mt.int64).dtype == mt.int64
    mt.manual_seed(1)
    first = mt.rand(3).data
    mt.manual_seed(1)
    np.testing.assert_array_equal(mt.rand(3).data, first)  # seeded, as randn
    with pytest.raises(ValueError, match="randint: needs low < high, got low=3, high=3"):
        mt.randint(3, 3, (2,))


@given(shapes=matmul_shapes, seed=seeds)
def test_matmul_with_zero_size_dims(shapes, seed):
    """The issue's cases: (8,0)@(0,8) failed forward, (8,8)@(8,0) failed backward."""
    rng = np.random.default_rng(seed)
    for a_shape, b_shape in [((8, 0), (0, 8)), ((8, 8), (8, 0)), ((0, 3), (3, 2)), ((2, 0, 3), (3, 4))]:
        a, b = leaf(rng, a_shape), leaf(rng, b_shape)
        out = a @ b
        np.testing.assert_array_equal(out.data, np.matmul(a.data, b.data))
        out.sum().backward()
        assert a.grad.shape == a.shape and b.grad.shape == b.shape and not a.grad.any()
    a, b = (leaf(rng, s) for s in shapes.input_shapes)
    assert mt.gradcheck(lambda a, b: a @ b, a, b)


def test_matmul_of_vectors_follows_pytorch():
    rng = np.random.default_rng(0)
    v, w, m, s = leaf(rng, (3,)), leaf(rng, (3,)), leaf(rng, (3, 4)), leaf(rng, (2, 4, 3))
    for a, b in [(v, w), (v, m), (s, v), (leaf(rng, (4, 3)), v), (v, leaf(rng, (2, 3, 4)))]:
        np.testing.assert_allclose((a @ b).data, np.matmul(a.data, b.data))
        assert mt.gradcheck(lambda a, b: a @ b, a, b)
    with pytest.raises(ValueError, match="matmul: both operands need at least 1 dim"):
        mt.tensor(2.0) @ v
    assert mt.dot(v, w).shape == () and mt.dot(v, w).item() == pytest.approx(float(np.dot(v.data, w.data)))
    assert v.dot(w).item() == mt.dot(v, w).item() and mt.gradcheck(mt.dot, v, w)
    with pytest.raises(ValueError, match=r"dot: needs two 1-d tensors of one length, got shapes \(3,\) and \(3, 4\)"):
        mt.dot(v, m)


def test_softmax_of_a_0d_tensor_and_where_with_two_numbers():
    x = mt.tensor(np.array(3.0), requires_grad=True)
    y = F.softmax(x)
    assert y.shape == () and y.item() == 1.0 and F.log_softmax(x).item() == 0.0
    y.backward()
    assert x.grad == 0.0
    cond = mt.tensor([True, False])
    assert mt.where(cond, 1, 3).data.tolist() == [1, 3] and mt.where(cond, 1, 3).dtype == mt.int64
    assert mt.where(cond, 1.0, 3).dtype == mt.float32
    assert mt.where(cond, mt.ones(2, dtype=mt.int32), 0.5).dtype == mt.float32
