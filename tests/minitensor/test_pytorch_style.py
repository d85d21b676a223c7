"""The surface a PyTorch user expects: `mt.nn` / `mt.optim` without further imports,
torch-style creation functions, and tensor methods with PyTorch's names (dim=, keepdim=,
t, unsqueeze, squeeze, view, size, float/double/to, flatten), each equal to numpy and
differentiable (gradcheck, float64). The first tests run a short training script written
exactly as a PyTorch user would write it."""
import copy
import pickle
import sys

import numpy as np
import pytest
from helpers import assert_close, leaf
from hypothesis import given
from hypothesis import strategies as st
from mpi_launch import run_command
from strategies import seeds, shapes_and_axes, small_shapes

import minitensor as mt
import minitensor.nn.functional as F
from minitensor import nn

# ---- a PyTorch-style script ---------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, n_in, n_hidden, n_out):
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_hidden)
        self.fc2 = nn.Linear(n_hidden, n_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def test_the_namespaces_need_no_further_import():
    """A fresh interpreter: only `import minitensor as mt`, then mt.nn, mt.nn.functional, mt.optim."""
    script = ("import minitensor as mt; "
              "print(mt.nn.Linear.__name__, mt.nn.functional.cross_entropy.__name__, mt.optim.AdamW.__name__)")
    result = run_command([sys.executable, "-c", script], timeout=60)
    assert result.stdout.split() == ["Linear", "cross_entropy", "AdamW"]


def test_a_pytorch_style_training_loop_lowers_the_loss_every_step():
    mt.manual_seed(0)
    x = mt.randn(24, 4)
    y = mt.tensor([0, 1, 2] * 8)
    model = MLP(4, 16, 3)
    optimizer = mt.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert loss.dtype == mt.float32 and all(p.grad.dtype == mt.float32 for p in model.parameters())
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def numpy_mlp_loss_and_grads(x, y, w1, b1, w2, b2):
    """The same MLP and mean cross-entropy, forward and backward written out in numpy."""
    pre = x @ w1.T + b1
    h = np.maximum(pre, 0)
    z = h @ w2.T + b2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = -np.log(p[rows, y]).mean()
    dz = p.copy()
    dz[rows, y] -= 1
    dz /= len(y)
    dh = (dz @ w2) * (pre > 0)
    return loss, [dh.T @ x, dh.sum(axis=0), dz.T @ h, dz.sum(axis=0)]


@given(seed=seeds)
def test_the_mlp_gradients_equal_numpy_and_finite_differences(seed):
    mt.manual_seed(seed)
    model = MLP(3, 5, 4).double()
    x = mt.randn(6, 3, dtype=mt.float64)
    y = mt.tensor(np.random.default_rng(seed).integers(0, 4, size=6))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    ref_loss, ref_grads = numpy_mlp_loss_and_grads(x.numpy(), y.numpy(), *(p.data for p in model.parameters()))
    assert_close(loss.item(), ref_loss)
    for (name, p), ref in zip(model.named_parameters(), ref_grads):
        assert_close(p.grad, ref, err_msg=name)
    # central differences perturb the parameters themselves, in place
    assert mt.gradcheck(lambda *params: F.cross_entropy(model(x), y), *model.parameters())


# ---- creation -------------------------------------------------------------------------


@given(shape=small_shapes, dtype=st.sampled_from([None, mt.float32, mt.float64, mt.int64]))
def test_zeros_and_ones_take_sizes_either_way_and_a_dtype(shape, dtype):
    for make, fill in ((mt.zeros, 0), (mt.ones, 1)):
        for made in (make(*shape, dtype=dtype), make(shape, dtype=dtype)):
            assert made.shape == shape and made.dtype == (dtype or mt.float32)
            np.testing.assert_array_equal(made.data, fill)
    assert mt.zeros(2, requires_grad=True).requires_grad


@given(seed=seeds, shape=small_shapes)
def test_randn_draws_from_the_seeded_default_generator(seed, shape):
    mt.manual_seed(seed)
    drawn = mt.randn(*shape, dtype=mt.float64, requires_grad=True)
    expected = np.random.default_rng(seed).standard_normal(shape)
    np.testing.assert_array_equal(drawn.data, expected)
    assert drawn.requires_grad and drawn.shape == shape
    mt.manual_seed(seed)
    np.testing.assert_array_equal(mt.randn(shape).data, expected.astype(np.float32))  # float32 by default


def test_arange_follows_pytorch_dtypes():
    np.testing.assert_array_equal(mt.arange(4).data, [0, 1, 2, 3])
    assert mt.arange(4).dtype == mt.int64
    assert mt.arange(1, 2, 0.25).dtype == mt.float32
    np.testing.assert_array_equal(mt.arange(1, 2, 0.25).data, [1, 1.25, 1.5, 1.75])
    assert mt.arange(3, dtype=mt.float64, requires_grad=True).requires_grad


def test_dtype_aliases_are_numpys():
    assert (mt.float32, mt.float64, mt.int64) == (np.float32, np.float64, np.int64)
    assert mt.tensor(np.ones(2), dtype=mt.float32).dtype == np.float32


def test_bad_creation_arguments_are_clear_errors():
    cases = [(lambda: mt.zeros(2, -1), ValueError, r"zeros.*\(2, -1\)"),
             (lambda: mt.ones(2.5), ValueError, r"ones.*2\.5"),
             (lambda: mt.randn(2, dtype=mt.int64), TypeError, "randn.*int64"),
             (lambda: mt.zeros(2, dtype=str), TypeError, "zeros.*<U"),
             (lambda: mt.arange(0, 3, 0), ValueError, "arange.*step"),
             (lambda: mt.zeros(2, dtype=mt.int64, requires_grad=True), TypeError, "floating-point")]
    for case, error, message in cases:
        with pytest.raises(error, match=message):
            case()


# ---- tensor methods with PyTorch's names ------------------------------------------------


@given(shape_axis=shapes_and_axes(), keep=st.booleans(), seed=seeds)
def test_sum_and_mean_take_dim_and_keepdim(shape_axis, keep, seed):
    shape, axis = shape_axis
    x = leaf(np.random.default_rng(seed), shape)
    for name in ("sum", "mean"):
        torch_style = getattr(x, name)(dim=axis, keepdim=keep)
        assert_close(torch_style.data, getattr(np, name)(x.data, axis=axis, keepdims=keep))
        np.testing.assert_array_equal(torch_style.data, getattr(x, name)(axis=axis, keepdims=keep).data)
        assert mt.gradcheck(lambda z, name=name: getattr(z, name)(dim=axis, keepdim=keep), x)


@given(shape=small_shapes.filter(len), keep=st.booleans(), data=st.data(), seed=seeds)
def test_max_with_dim_returns_values_and_indices_as_in_pytorch(shape, keep, data, seed):
    x = leaf(np.random.default_rng(seed), shape)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    values, indices = x.max(dim=dim, keepdim=keep)
    np.testing.assert_array_equal(values.data, np.max(x.data, axis=dim, keepdims=keep))
    np.testing.assert_array_equal(indices.data, np.argmax(x.data, axis=dim, keepdims=keep))
    assert x.max(dim=dim).values.shape == x.max(axis=dim).shape  # numpy's axis= gives the values alone
    assert mt.gradcheck(lambda z: z.max(dim=dim, keepdim=keep).values, x)


def test_reduction_arguments_are_checked():
    x = mt.zeros(2, 3)
    with pytest.raises(TypeError, match="axis=0 and dim=1"):
        x.sum(axis=0, dim=1)
    with pytest.raises(IndexError, match=r"mean: axis 2 .*\(2, 3\)"):
        x.mean(dim=2)
    with pytest.raises(IndexError, match=r"sum: axis -3 .*\(2, 3\)"):
        x.sum(axis=-3)  # the old code wrapped it around to axis 0
    with pytest.raises(TypeError, match=r"max: dim must be one int.*\(0, 1\)"):
        x.max(dim=(0, 1))


@given(shape=small_shapes, data=st.data(), seed=seeds)
def test_shape_methods_equal_numpy_and_are_differentiable(shape, data, seed):
    x = leaf(np.random.default_rng(seed), shape, transposed=True)
    n = len(shape)
    new = data.draw(st.integers(-n - 1, n), label="unsqueeze dim")
    start = data.draw(st.integers(0, max(n - 1, 0)), label="flatten start")
    end = data.draw(st.integers(start, max(n - 1, 0)), label="flatten end")
    squeezed = data.draw(st.integers(-n, n - 1), label="squeeze dim") if n else None
    programs = {
        "unsqueeze": (lambda z: z.unsqueeze(new), lambda a: np.expand_dims(a, new)),
        "squeeze": (lambda z: z.squeeze(), np.squeeze),
        "flatten": (lambda z: z.flatten(start, end),
                    lambda a: a.reshape(a.shape[:start] + (-1,) + a.shape[end + 1:]) if n else a.reshape(1)),
        "view": (lambda z: z.view(-1), lambda a: a.reshape(-1)),
    }
    if n <= 2:
        programs["t"] = (lambda z: z.t(), np.transpose)
    if n:  # squeeze(dim) drops that dim only if it has size 1, as in PyTorch
        programs["squeeze dim"] = (lambda z: z.squeeze(squeezed),
                                   lambda a: np.squeeze(a, squeezed) if a.shape[squeezed] == 1 else a)
    for name, (method, reference) in programs.items():
        np.testing.assert_array_equal(method(x).data, reference(x.data), err_msg=name)
        assert mt.gradcheck(method, x), name


def test_size_is_numpys_count_and_pytorchs_method():
    x = mt.zeros(2, 3, 4)
    assert x.size == 24 and x.numel() == 24 and x.dim() == 3  # numpy's attribute still works
    assert x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4
    assert sum(p.size for p in MLP(3, 5, 2).parameters()) == 3 * 5 + 5 + 5 * 2 + 2
    assert pickle.loads(pickle.dumps(x.size)) == 24 and copy.deepcopy(x.size) == 24


def test_float_double_and_to_convert_differentiably():
    x = mt.tensor([1.5, -2.0], dtype=mt.float64, requires_grad=True)
    assert x.double() is x and x.to(mt.float64) is x  # already that dtype: itself, as in PyTorch
    y = x.float()
    assert y.dtype == mt.float32 and x.to(np.float32).dtype == mt.float32
    y.backward(np.array([3.0, 4.0], np.float32))
    assert x.grad.dtype == mt.float64
    np.testing.assert_array_equal(x.grad, [3.0, 4.0])
    assert mt.tensor([1, 2]).float().dtype == mt.float32 and mt.tensor([1.0]).double().dtype == mt.float64
    with pytest.raises(TypeError, match="to: expected a dtype.*'cpu'"):
        x.to("cpu")


def test_shape_method_errors_name_the_dim_and_shape():
    x = mt.zeros(2, 3)
    cases = [(lambda: x.unsqueeze(3), IndexError, r"unsqueeze: dim 3 .*\(2, 3\)"),
             (lambda: x.squeeze(-3), IndexError, r"squeeze: dim -3 .*\(2, 3\)"),
             (lambda: x.flatten(1, 0), ValueError, r"flatten.*1.*0.*\(2, 3\)"),
             (lambda: mt.zeros(2, 3, 4).t(), ValueError, r"t: .*\(2, 3, 4\).*transpose")]
    for case, error, message in cases:
        with pytest.raises(error, match=message):
            case()


def test_a_float64_array_for_a_float32_module_says_how_to_cast():
    mt.manual_seed(0)
    layer = nn.Linear(3, 2)
    data = np.random.default_rng(0).standard_normal((4, 3))
    with pytest.raises(TypeError, match=r"float64.*float32.*mt\.tensor\(x, dtype=mt\.float32\)"):
        layer(data)
    converted = layer(mt.tensor(data, dtype=mt.float32))  # the documented path
    np.testing.assert_array_equal(layer(data.astype(np.float32)).data, converted.data)  # same-dtype arrays work
