"""Flat optimizer buffers: AdamW and SGD give bitwise the same parameters with the layout on
and off (the same arithmetic on each element), gradients are born in the flat buffer as
plain ndarray views, and the layout survives what re-binds arrays under it."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
from minitensor import flat_params, speed
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import SGD, AdamW

CONFIG = GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=2, d_model=8)
OPTIMIZERS = {
    "adamw": lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw-bf16-moments": lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1, moment_dtype="bfloat16"),
    "sgd": lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-plain": lambda ps: SGD(ps, lr=0.1),
}


def train(make_optimizer, dtype, steps, seed=0, freeze=None):
    """Parameters after `steps` optimizer steps of a small GPT (`freeze`: a name to freeze)."""
    mt.manual_seed(seed)
    model = GPT(CONFIG, dtype=dtype)
    for name, p in model.named_parameters():
        p.requires_grad = name != freeze
    optimizer = make_optimizer(model.parameters())
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = rng.integers(0, CONFIG.vocab_size, size=(3, CONFIG.block_size))
        optimizer.zero_grad()
        model(idx, np.roll(idx, -1, axis=1))[1].backward()
        optimizer.step()
    return model, optimizer


@settings(max_examples=6, deadline=None)
@given(name=st.sampled_from(sorted(OPTIMIZERS)), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 3), freeze=st.sampled_from([None, "blocks.0.attn.q.weight"]))
def test_flat_and_per_tensor_updates_are_bitwise_equal(name, dtype, seed, freeze):
    flat, _ = train(OPTIMIZERS[name], dtype, 3, seed, freeze)
    with speed.disabled("flat_optimizer"):
        plain, _ = train(OPTIMIZERS[name], dtype, 3, seed, freeze)
    for (key, a), (_, b) in zip(flat.named_parameters(), plain.named_parameters()):
        np.testing.assert_array_equal(a.data, b.data, err_msg=key)


def test_blocks_and_kernel_threads_cover_every_element(monkeypatch):
    """With blocks of 7 elements and a 'thread' split at 1 element, the flat update still
    equals the per-tensor one (the pieces cover [0, n) exactly once)."""
    monkeypatch.setattr(flat_params, "BLOCK", 7)
    monkeypatch.setattr(flat_params.kernel_threads, "MIN_ELEMENTS", 1)
    flat, _ = train(OPTIMIZERS["adamw"], np.float64, 2)
    with speed.disabled("flat_optimizer"):
        plain, _ = train(OPTIMIZERS["adamw"], np.float64, 2)
    for a, b in zip(flat.parameters(), plain.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_gradients_are_plain_views_of_one_flat_buffer_per_dtype():
    model, optimizer = train(OPTIMIZERS["adamw"], np.float32, 2)
    (layout,) = optimizer._flat.values()
    for p in model.parameters():
        assert type(p.grad) is np.ndarray and p.grad.base is layout.grad and p.data.base is layout.data
        index = next(i for i, q in enumerate(optimizer.params) if q is p)  # `==` of tensors is elementwise
        assert optimizer.state[index]["exp_avg"].base is layout.state["exp_avg"]


def test_a_rebound_parameter_or_loaded_state_is_laid_out_again_with_its_values():
    model, optimizer = train(OPTIMIZERS["adamw"], np.float64, 2)
    p = model.parameters()[0]
    p.data = p.data.copy() + 1.0  # re-bound under the layout
    saved = optimizer.state_dict()
    optimizer.load_state_dict(saved)  # fresh state arrays
    expected = p.data.copy()
    optimizer.zero_grad()
    for q in model.parameters():
        q.grad = np.zeros_like(q.data)
    with speed.disabled("flat_optimizer"):
        reference = AdamW([mt.nn.Parameter(expected.copy())], lr=1e-2, weight_decay=0.1)
        reference.load_state_dict({"defaults": saved["defaults"], "state": {0: saved["state"][0]}})
        reference.params[0].grad = np.zeros_like(expected)
        reference.step()
    optimizer.step()
    assert p.data.base is optimizer._flat[p.dtype].data
    np.testing.assert_array_equal(p.data, reference.params[0].data)


def test_turning_the_switch_off_releases_the_gradient_slots():
    model, optimizer = train(OPTIMIZERS["adamw"], np.float32, 1)
    with speed.disabled("flat_optimizer"):
        optimizer.step()
        assert not optimizer._flat and all(p._grad_slot is None for p in model.parameters())


def test_an_unknown_switch_is_named():
    with pytest.raises(ValueError, match=r"unknown switch\(es\) \['flat'\]"):
        with speed.disabled("flat"):
            pass
