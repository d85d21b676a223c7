"""The backward split into B (input gradients) and W (weight gradients): bitwise one backward."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import matmul_shapes, seeds

import minitensor as mt
import minitensor.nn.functional as F
from minitensor.models import GPT, GPTConfig
from minitensor.nn.module import Parameter
from minitensor.split_backward import WeightGradStore, backward_input


def test_linear_by_hand_b_gives_dx_now_and_w_gives_dw_db_later():
    rng = np.random.default_rng(0)
    x = mt.Tensor(rng.standard_normal((5, 3)), requires_grad=True)
    w, b = Parameter(rng.standard_normal((4, 3))), Parameter(rng.standard_normal(4))
    dy = rng.standard_normal((5, 4))
    weights = backward_input(F.linear(x, w, b), dy, inputs=[x])
    assert np.array_equal(x.grad, dy @ w.data)               # B: dx = dy·W
    assert w.grad is None and b.grad is None                  # W has not run
    weights()
    assert np.array_equal(w.grad, dy.T @ x.data)             # W: dW = dyᵀ·x
    assert np.array_equal(b.grad, dy.sum(axis=0))            #    db = Σ dy


def test_b_computes_no_weight_product_and_w_no_input_product():
    rng = np.random.default_rng(1)
    x = mt.Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    w = Parameter(rng.standard_normal((4, 3)))
    y = F.linear(x, w)
    calls = []
    node = y._node
    original = node.backward_parts

    def spy(grad, wanted):
        calls.append(wanted)
        return original(grad, wanted)

    node.backward_parts = spy
    weights = backward_input(y, np.ones((2, 4)), inputs=[x])
    weights()
    assert calls == [(True, False), (False, True)]


def gpt_grads(split, seed, dropout):
    config = GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=2, d_model=8, dropout=dropout)
    mt.manual_seed(seed)
    model = GPT(config, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, 11, (3, 6))
    _, loss = model(idx, idx)
    if split:
        weights = backward_input(loss)
        assert all(p.grad is None for p in model.parameters())  # every GPT parameter waits for W
        weights()
    else:
        loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


@given(seed=seeds, dropout=st.sampled_from([0.0, 0.2]))
def test_b_then_w_is_bitwise_one_backward_of_a_gpt(seed, dropout):
    full, split = gpt_grads(False, seed, dropout), gpt_grads(True, seed, dropout)
    assert full.keys() == split.keys()
    for name in full:
        assert np.array_equal(full[name], split[name]), name


@given(shapes=matmul_shapes, seed=seeds)
def test_matmul_with_a_weight_operand_splits_bitwise(shapes, seed):
    (a_shape, b_shape), _ = shapes
    rng = np.random.default_rng(seed)
    a_data, b_data = rng.standard_normal(a_shape), rng.standard_normal(b_shape)

    def grads(split):
        a, b = mt.Tensor(a_data, requires_grad=True), Parameter(b_data)
        y = (a @ b).tanh()
        dy = np.cos(np.arange(y.size, dtype=np.float64)).reshape(y.shape)
        if split:
            weights = backward_input(y, dy, inputs=[a])
            assert b.grad is None
            weights()
        else:
            y.backward(dy)
        return a.grad, b.grad

    for full, split in zip(grads(False), grads(True)):
        assert np.array_equal(full, split)


@pytest.mark.parametrize("a_shape, b_shape", [((5, 3), (3, 4)), ((2, 5, 3), (2, 3, 4)), ((2, 5, 3), (3, 4))])
@pytest.mark.parametrize("wanted", [(True, False), (False, True)])
def test_matmul_backward_parts_computes_only_the_wanted_gradients(a_shape, b_shape, wanted):
    """A split backward asks MatMul for dA alone (B) or dB alone (W): the other must be None,
    never computed and handed back (B would then add a weight's gradient W adds again)."""
    rng = np.random.default_rng(5)
    a, b = mt.Tensor(rng.standard_normal(a_shape), requires_grad=True), Parameter(rng.standard_normal(b_shape))
    y = a @ b
    dy = rng.standard_normal(y.shape)
    parts = y._node.backward_parts(dy, wanted)  # before backward(), which releases the node
    y.backward(dy)
    for part, want, full, name in zip(parts, wanted, (a.grad, b.grad), ("dA", "dB")):
        if want:
            np.testing.assert_allclose(part, full, rtol=1e-12, err_msg=f"{name} with wanted={wanted}")
        else:
            assert part is None, f"wanted={wanted} does not ask for {name}, so backward_parts must return None for it"


def test_a_weight_used_twice_sums_both_uses_in_w():
    rng = np.random.default_rng(2)
    x = mt.Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    w = Parameter(rng.standard_normal((3, 3)))
    y = F.linear(F.linear(x, w).tanh(), w).sum()
    y.backward()
    expected, x_grad = w.grad.copy(), x.grad.copy()
    w.grad = x.grad = None
    backward_input(F.linear(F.linear(x, w).tanh(), w).sum(), inputs=[x])()
    assert np.array_equal(w.grad, expected) and np.array_equal(x.grad, x_grad)


def test_store_runs_each_w_once_and_names_a_w_without_its_b():
    rng = np.random.default_rng(3)
    w = Parameter(rng.standard_normal((2, 2)))
    store = WeightGradStore()
    store.put((0, 0), backward_input(F.linear(mt.Tensor(np.ones((1, 2))), w).sum()))
    with pytest.raises(RuntimeError, match=r"weight gradients of \(0, 0\) are already waiting"):
        store.put((0, 0), backward_input(F.linear(mt.Tensor(np.ones((1, 2))), w).sum()))
    assert len(store) == 1
    store.run((0, 0))
    assert len(store) == 0 and np.array_equal(w.grad, np.ones((2, 2)))
    with pytest.raises(RuntimeError, match=r"W of \(0, 0\) before its B"):
        store.run((0, 0))


def test_saved_bytes_count_what_w_needs_but_not_the_weights():
    rng = np.random.default_rng(4)
    x = mt.Tensor(rng.standard_normal((5, 3)), requires_grad=True)
    w = Parameter(rng.standard_normal((4, 3)))
    weights = backward_input(F.linear(x, w), np.ones((5, 4)), inputs=[x])
    assert weights.saved_bytes() == x.data.nbytes + 5 * 4 * 8  # x and dy; W is model state
    weights()
    assert weights.saved_bytes() == 0


def test_backward_input_without_gradient_needs_a_scalar():
    y = F.linear(mt.Tensor(np.ones((2, 2))), Parameter(np.ones((3, 2))))
    with pytest.raises(RuntimeError, match=r"needs a scalar output; this tensor has shape \(2, 3\)"):
        backward_input(y)
