"""minitensor.recompute: same values and gradients as the plain call, fewer saved arrays,
the same dropout masks on recomputation."""
import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
from minitensor import graph, nn
from minitensor.models.gpt import GPT, GPTConfig


def loss_and_grads(model, idx, targets, recomputed, seed):
    """Mean loss of `model` with every block optionally recomputed; grads by name."""
    mt.manual_seed(seed)
    model.zero_grad()
    x = model.embed(idx)
    for block in model.blocks:
        x = mt.recompute(block, x) if recomputed else block(x)
    _, loss = model.head(x, targets)
    saved = graph.totals(loss)["saved_bytes"]
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}, saved


def small_gpt(seed, dropout, n_layer=2):
    mt.manual_seed(seed)
    cfg = GPTConfig(vocab_size=11, block_size=6, n_layer=n_layer, n_head=2, d_model=8, dropout=dropout)
    rng = np.random.default_rng(seed)
    idx, targets = (rng.integers(0, 11, (3, 6)) for _ in range(2))
    return GPT(cfg).double(), idx, targets


@given(seed=st.integers(0, 2**16), dropout=st.sampled_from([0.0, 0.3]), n_layer=st.integers(1, 3))
def test_recomputed_blocks_give_the_same_loss_and_gradients(seed, dropout, n_layer):
    model, idx, targets = small_gpt(seed, dropout, n_layer)
    ref_loss, ref_grads, ref_saved = loss_and_grads(model, idx, targets, False, seed)
    ref_grads = {n: g.copy() for n, g in ref_grads.items()}
    loss, grads, saved = loss_and_grads(model, idx, targets, True, seed)
    assert_close(loss, ref_loss)
    for name, g in grads.items():
        assert_close(g, ref_grads[name])
    assert saved < ref_saved


def test_dropout_masks_are_replayed_and_the_generator_continues_undisturbed():
    """With dropout p=0.5, a recomputation with a fresh mask gives a different gradient;
    the recomputed gradient equals the plain one, and the draws after backward are the
    ones a plain run would see next."""
    x0 = np.random.default_rng(0).standard_normal((4, 5))
    drop = nn.Dropout(0.5)

    def run(recomputed):
        mt.manual_seed(7)
        x = mt.tensor(x0, requires_grad=True)
        y = mt.recompute(drop, x) if recomputed else drop(x)
        (y * y).sum().backward()
        return x.grad, mt.default_generator().random(3)

    (g_ref, next_ref), (g, next_draws) = run(False), run(True)
    assert (g_ref == 0).any() and (g_ref != 0).any()  # a real mask was drawn
    np.testing.assert_array_equal(g, g_ref)
    np.testing.assert_array_equal(next_draws, next_ref)


def test_an_explicit_dropout_generator_is_replayed_when_named():
    x0 = np.ones((6, 6))
    gen = np.random.default_rng(3)
    drop = nn.Dropout(0.5, generator=gen)
    x = mt.tensor(x0, requires_grad=True)
    y = mt.recompute(drop, x, generators=(gen,))
    mask = y.data != 0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad != 0, mask)


def test_parameters_get_gradients_when_no_input_requires_grad_and_constants_pass_through():
    mt.manual_seed(1)
    lin = nn.Linear(3, 2).double()
    x = mt.tensor(np.arange(6.0).reshape(2, 3))
    scale = np.array([[2.0], [3.0]])
    out = mt.recompute(lambda a, s: lin(a) * mt.tensor(s), x, scale)
    out.sum().backward()
    np.testing.assert_allclose(lin.weight.grad, (scale * np.ones((2, 2))).T @ x.data)
    assert x.grad is None


def test_under_no_grad_it_is_a_plain_call_and_a_non_tensor_result_is_rejected():
    x = mt.tensor(np.ones(3), requires_grad=True)
    with mt.no_grad():
        y = mt.recompute(lambda a: a * 2.0, x)
    assert y._node is None and not y.requires_grad
    with pytest.raises(TypeError, match="must return one Tensor, got tuple"):
        mt.recompute(lambda a: (a, a), x)
