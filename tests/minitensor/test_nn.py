"""Modules, layers, optimizers and gradient clipping against hand-written references."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds

import minitensor as mt
from minitensor import nn
from minitensor.nn import functional as F
from minitensor.optim import SGD, AdamW


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.layers = nn.ModuleList([nn.Linear(3, 4), nn.Linear(4, 2, bias=False)])
        self.norm = nn.LayerNorm(2)
        self.scale = nn.Parameter(np.ones(1, np.float32))


def test_parameters_are_named_by_attribute_path_in_registration_order():
    # as in PyTorch: a module's own parameters first, then each submodule's in registration order
    assert [name for name, _ in Net().named_parameters()] == [
        "scale", "embed.weight", "layers.0.weight", "layers.0.bias", "layers.1.weight", "norm.weight", "norm.bias"]
    assert [name for name, _ in Net().named_modules()] == ["", "embed", "layers", "layers.0", "layers.1", "norm"]


def test_reassigning_and_sharing_parameters():
    net = Net()
    net.layers = nn.Linear(3, 3)  # replaces the ModuleList and its parameters
    net.tied = net.embed.weight  # a shared parameter is listed once, under the first name found
    names = [name for name, _ in net.named_parameters()]
    assert names == ["scale", "tied", "layers.weight", "layers.bias", "norm.weight", "norm.bias"]
    net.scale = None
    assert "scale" not in dict(net.named_parameters())
    assert net.num_parameters() == 15 + 12 + 4


def test_a_module_must_call_super_init():
    class Forgetful(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(1))

    with pytest.raises(RuntimeError, match="super"):
        Forgetful()


def test_train_eval_and_dtype_conversion_reach_every_submodule():
    net = Net().eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    assert all(p.dtype == np.float64 for p in net.double().parameters())


def test_state_dict_is_a_copy_and_round_trips():
    mt.manual_seed(0)
    a = Net()
    mt.manual_seed(1)
    b = Net()
    state = a.state_dict()
    state["scale"][...] = 5.0
    assert a.scale.data[0] == 1.0  # a copy, not a view of the parameter
    b.load_state_dict(a.state_dict())
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_load_state_dict_strict_errors_name_the_keys_and_shapes():
    net = Net()
    state = net.state_dict()
    del state["norm.bias"]
    state["extra.weight"] = np.zeros(2)
    with pytest.raises(KeyError, match=r"norm\.bias.*extra\.weight"):
        net.load_state_dict(state)
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert missing == ["norm.bias"] and unexpected == ["extra.weight"]

    state = net.state_dict()
    before = net.embed.weight.data.copy()
    state["embed.weight"] += 1
    state["layers.1.weight"] = np.zeros((2, 5))
    with pytest.raises(ValueError, match=r"layers\.1\.weight.*\(2, 5\).*\(2, 4\)"):
        net.load_state_dict(state)
    np.testing.assert_array_equal(net.embed.weight.data, before)  # nothing was loaded


@given(fan_in=st.integers(1, 64), fan_out=st.integers(1, 8), seed=seeds)
def test_linear_init_bounds(fan_in, fan_out, seed):
    mt.manual_seed(seed)
    layer = nn.Linear(fan_in, fan_out, dtype=np.float64)
    bound = 1 / math.sqrt(fan_in)
    assert layer.weight.shape == (fan_out, fan_in) and layer.bias.shape == (fan_out,)
    assert layer.weight.dtype == np.float64
    for p in (layer.weight, layer.bias):
        assert np.abs(p.data).max() <= bound
    if fan_in * fan_out >= 64:  # the draws fill the interval, not a narrower one
        assert np.abs(layer.weight.data).max() > 0.8 * bound


def test_layer_norm_module_starts_as_the_identity_normalisation():
    ln = nn.LayerNorm(4, dtype=np.float64)
    x = mt.tensor(np.random.default_rng(0).standard_normal((3, 4)))
    np.testing.assert_array_equal(ln.weight.data, 1)
    np.testing.assert_array_equal(ln.bias.data, 0)
    y = ln(x).data
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1 / (1 + 1e-5 / x.data.var(-1)), rtol=1e-10)
    np.testing.assert_array_equal(y, F.layer_norm(x, ln.weight, ln.bias).data)


def params_and_grads(seed, steps):
    rng = np.random.default_rng(seed)
    params = [nn.Parameter(rng.standard_normal(s)) for s in [(3, 2), (4,)]]
    grads = [[rng.standard_normal(p.shape) for p in params] for _ in range(steps)]
    return params, grads


@given(seed=seeds, momentum=st.sampled_from([0.0, 0.9]), weight_decay=st.sampled_from([0.0, 0.1]))
def test_sgd_matches_the_reference_formula(seed, momentum, weight_decay):
    params, grads = params_and_grads(seed, 3)
    expected = [p.data.copy() for p in params]
    velocity = [np.zeros_like(p.data) for p in params]
    opt = SGD(params, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.copy()
        opt.step()
        for i, g in enumerate(step_grads):
            d = g + weight_decay * expected[i]
            velocity[i] = momentum * velocity[i] + d
            expected[i] = expected[i] - 0.1 * (velocity[i] if momentum else d)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-13, atol=1e-15)


@given(seed=seeds, weight_decay=st.sampled_from([0.0, 0.1]))
def test_adamw_matches_the_reference_formula(seed, weight_decay):
    params, grads = params_and_grads(seed, 4)
    lr, (b1, b2), eps = 0.01, (0.9, 0.99), 1e-8
    expected = [p.data.copy() for p in params]
    m = [np.zeros_like(p.data) for p in params]
    v = [np.zeros_like(p.data) for p in params]
    opt = AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay)
    for t, step_grads in enumerate(grads, start=1):
        for p, g in zip(params, step_grads):
            p.grad = g.copy()
        opt.step()
        for i, g in enumerate(step_grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g**2
            m_hat, v_hat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
            expected[i] = expected[i] - lr * weight_decay * expected[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: AdamW(ps, lr=0.01)])
def test_optimizer_state_dict_round_trip_continues_identically(make):
    params, grads = params_and_grads(0, 4)
    opt = make(params)
    for step_grads in grads[:2]:
        for p, g in zip(params, step_grads):
            p.grad = g.copy()
        opt.step()
    clones = [nn.Parameter(p.data.copy()) for p in params]
    restored = make(clones)
    state = opt.state_dict()
    restored.load_state_dict(state)
    for s in state["state"].values():  # the loaded state is a copy
        for value in s.values():
            if isinstance(value, np.ndarray):
                value += 1000.0
    for step_grads in grads[2:]:
        for group in (params, clones):
            for p, g in zip(group, step_grads):
                p.grad = g.copy()
        opt.step()
        restored.step()
    for p, q in zip(params, clones):
        np.testing.assert_array_equal(p.data, q.data)


def test_optimizer_load_rejects_a_state_of_the_wrong_shape():
    params, _ = params_and_grads(0, 0)
    opt = AdamW(params)
    bad = {"defaults": {}, "state": {0: {"step": 1, "exp_avg": np.zeros((2, 3)), "exp_avg_sq": np.zeros((3, 2))}}}
    with pytest.raises(ValueError, match=r"exp_avg.*\(2, 3\).*\(3, 2\)"):
        opt.load_state_dict(bad)


@given(seed=seeds, max_norm=st.sampled_from([0.1, 1.0, 100.0]))
def test_clip_grad_norm_scales_to_the_max_and_returns_the_old_norm(seed, max_norm):
    params, (grads,) = params_and_grads(seed, 1)
    for p, g in zip(params, grads):
        p.grad = g.copy()
    norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
    assert nn.utils.clip_grad_norm_(params, max_norm) == pytest.approx(norm, rel=1e-12)
    new_norm = math.sqrt(sum(float((p.grad**2).sum()) for p in params))
    assert new_norm == pytest.approx(min(norm, max_norm), rel=1e-5)
    for p, g in zip(params, grads):  # the direction is kept
        np.testing.assert_allclose(p.grad * norm / new_norm, g, rtol=1e-10)


def test_layer_sizes_must_be_positive_integers_and_the_message_names_the_value():
    """Linear(0, 2) used to fail inside its init as a ZeroDivisionError, negative sizes as
    numpy's 'negative dimensions are not allowed', naming neither the layer nor the value."""
    cases = [(lambda: nn.Linear(0, 2), "Linear: in_features .* got 0"),
             (lambda: nn.Linear(-1, 2), "Linear: in_features .* got -1"),
             (lambda: nn.Linear(3, -2), "Linear: out_features .* got -2"),
             (lambda: nn.Linear(2.5, 2), "Linear: in_features .* got 2.5"),
             (lambda: nn.Embedding(-1, 4), "Embedding: num_embeddings .* got -1"),
             (lambda: nn.Embedding(5, 0), "Embedding: embedding_dim .* got 0"),
             (lambda: nn.LayerNorm(-2), "LayerNorm: normalized_shape .* got -2"),
             (lambda: nn.LayerNorm((0,)), "LayerNorm: normalized_shape .* got 0")]
    for case, message in cases:
        with pytest.raises(ValueError, match=message):
            case()
    assert nn.LayerNorm((4,)).weight.shape == (4,)  # PyTorch's tuple form still works
