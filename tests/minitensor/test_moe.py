"""minitensor.nn.moe: routing, capacity, the balancing and z-losses, dispatch and combine,
each against a plain numpy reading of its definition; backward against central differences;
and the GPT whose MLPs are mixtures (the dense GPT, E = 0, unchanged)."""
import math

import numpy as np
import pytest

import minitensor as mt
from minitensor.gradcheck import gradcheck
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn.moe import LocalDispatcher, MoE, balancing_loss, capacity, dispatch_order, top_k, within_capacity


def moe(renormalize=True, capacity_factor=None, top=2, experts=4, dispatcher=None):
    mt.manual_seed(1)
    layer = MoE(6, 10, experts, top, renormalize, capacity_factor, aux_loss_coef=0.3, z_loss_coef=0.05,
                dtype=np.float64, dispatcher=dispatcher)
    for p in layer.parameters():
        p.data[...] = np.random.default_rng(p.size).normal(0, 0.5, p.shape)
    return layer


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # chapter 20's router runs in both
def test_top_k_takes_the_largest_probabilities_lower_index_first_on_ties(dtype):
    probs = np.array([[0.1, 0.5, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype)
    assert top_k(probs, 2).tolist() == [[1, 2], [0, 1]]
    # 40 experts and three distinct values: many ties, more than an insertion sort's few elements
    counts = np.random.default_rng(0).integers(1, 4, (16, 40)).astype(dtype)
    probs = counts / counts.sum(axis=-1, keepdims=True)
    want = [sorted(range(40), key=lambda e: (-probs[row, e], e))[:2] for row in range(16)]
    assert top_k(probs, 2).tolist() == want


def test_capacity_keeps_first_choices_then_earlier_tokens_per_sequence():
    assert capacity(tokens=6, k=2, n_experts=4, factor=1.0) == 3 and capacity(5, 1, 4, 0.5) == 1
    experts = np.array([[0, 1], [1, 0], [0, 2], [0, 1]])  # 4 tokens, two sequences of 2
    kept = within_capacity(experts, group_size=2, cap=1).reshape(4, 2)
    # sequence 0: expert 0 gets token 0's first choice, expert 1 token 1's first choice
    # sequence 1: expert 0 gets token 2's and token 3's first choices: only token 2's fits
    assert kept.tolist() == [[True, False], [True, False], [True, True], [False, True]]


def test_a_capacity_of_every_token_drops_none_and_a_huge_factor_does_not_overflow():
    assert capacity(6, 2, 4, 2.0) == 6 == capacity(6, 2, 4, 1e308) and capacity(6, 2, 4, 1.9) == 6
    x = mt.tensor(np.random.default_rng(2).normal(size=(2, 6, 6)))
    np.testing.assert_array_equal(moe(capacity_factor=1e308)(x).data, moe()(x).data)


def test_the_dispatch_order_sorts_kept_assignments_by_expert_in_token_order():
    order, counts = dispatch_order(np.array([2, 0, 2, 1, 0]), np.array([True, True, True, True, False]), 3)
    assert order.tolist() == [1, 3, 0, 2] and counts.tolist() == [1, 1, 2]
    # 200 assignments over 3 experts: each expert's long run of ties must keep the token order
    rng = np.random.default_rng(0)
    expert, kept = rng.integers(0, 3, 200), rng.random(200) < 0.8
    order, counts = dispatch_order(expert, kept, 4)
    assert order.tolist() == sorted(np.flatnonzero(kept), key=lambda i: (expert[i], i))
    assert counts.tolist() == [int(np.sum(kept & (expert == e))) for e in range(4)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # chapter 20's router runs in both
def test_the_balancing_loss_is_alpha_for_a_uniform_router_and_grows_with_imbalance(dtype):
    close = dict(rel_tol=1e-6 if dtype == np.float32 else 1e-12)
    uniform = mt.tensor(np.full((4, 4), 0.25, dtype))
    loss = balancing_loss(uniform, np.array([[0], [1], [2], [3]]), 1, 0.1)
    assert loss.dtype == dtype and math.isclose(loss.item(), 0.1, **close)  # the router's dtype, never wider
    assert math.isclose(balancing_loss(uniform, np.array([[0, 1], [2, 3], [1, 0], [3, 2]]), 2, 0.1).item(), 0.1,
                        **close)
    skewed = mt.tensor(np.tile(np.array([0.7, 0.1, 0.1, 0.1], dtype), (4, 1)))
    loss = balancing_loss(skewed, np.zeros((4, 1), int), 2, 0.1)
    assert loss.dtype == dtype and math.isclose(loss.item(), 0.1 * 4 * 0.7, **close)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("capacity_factor", [None, 0.5])
def test_the_layer_equals_its_definition_token_by_token(renormalize, capacity_factor):
    layer = moe(renormalize, capacity_factor)
    x = np.random.default_rng(0).normal(size=(2, 3, 6))
    y = layer(mt.tensor(x)).data.reshape(6, 6)
    flat = x.reshape(6, 6)
    logits = flat @ layer.router.weight.data.T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    chosen = top_k(probs, 2)
    kept = np.ones(12, bool) if capacity_factor is None else within_capacity(chosen, 3, capacity(3, 2, 4, 0.5))
    for t in range(6):
        gates = probs[t, chosen[t]] / (probs[t, chosen[t]].sum() if renormalize else 1)
        want = sum(g * layer.experts[e](mt.tensor(flat[t:t + 1])).data[0]
                   for j, (e, g) in enumerate(zip(chosen[t], gates)) if kept[2 * t + j])
        np.testing.assert_allclose(y[t], want, rtol=1e-12, atol=1e-15)
    assert layer.dropped == 12 - kept.sum() and layer.load.sum() == kept.sum()


@pytest.mark.parametrize("renormalize, capacity_factor, top", [(True, None, 2), (False, 0.75, 2), (False, None, 1)])
def test_backward_matches_central_differences(renormalize, capacity_factor, top):
    layer = moe(renormalize, capacity_factor, top)
    x = mt.tensor(np.random.default_rng(2).normal(size=(2, 3, 6)), requires_grad=True)
    checked = [x, layer.router.weight, layer.experts[1].fc.weight, layer.experts[2].proj.bias]
    gradcheck(lambda *_: layer(x) + layer.aux_loss, *checked)


class Doubling:
    """A dispatcher whose experts' outputs come back doubled; it keeps the routing it was given."""

    def run_experts(self, x, routing, experts):
        self.routing = routing
        return LocalDispatcher().run_experts(x, routing, experts) * 2


def test_the_layer_reaches_its_experts_through_its_dispatcher_which_holds_no_parameters():
    local, doubling = moe(capacity_factor=0.5), moe(capacity_factor=0.5, dispatcher=Doubling())
    x = mt.tensor(np.random.default_rng(0).normal(size=(2, 3, 6)))
    np.testing.assert_allclose(doubling(x).data, 2 * local(x).data, rtol=1e-15)
    routing = doubling.dispatcher.routing
    assert np.bincount(routing.expert[routing.kept], minlength=4).tolist() == local.load.tolist()
    assert list(doubling.state_dict()) == list(local.state_dict())
    assert "dispatcher" not in dict(local.named_modules())  # a part, but no Module


def test_the_dense_gpt_is_unchanged_and_moe_blocks_follow_moe_every():
    sizes = dict(vocab_size=11, block_size=6, n_layer=4, n_head=2, d_model=8)
    mt.manual_seed(0)
    dense = GPT(GPTConfig(**sizes), dtype=np.float64)
    assert not any("router" in name or "experts" in name for name, _ in dense.named_parameters())
    mt.manual_seed(0)
    mixed = GPT(GPTConfig(**sizes, n_experts=3, top_k=1, moe_every=2), dtype=np.float64)
    assert [isinstance(b.mlp, MoE) for b in mixed.blocks] == [False, True, False, True]
    assert "blocks.3.mlp.experts.2.proj.weight" in dict(mixed.named_parameters())
    idx = np.random.default_rng(0).integers(0, 11, (2, 6))
    _, loss = mixed(idx, idx)
    _, cross_entropy = GPT.head(mixed, mixed.blocks[3](mixed.blocks[2](mixed.blocks[1](mixed.blocks[0](
        mixed.embed(idx))))), idx)
    assert math.isclose(loss.item(), cross_entropy.item() + mixed.blocks[1].mlp.aux_loss.item()
                        + mixed.blocks[3].mlp.aux_loss.item(), rel_tol=1e-12)


@pytest.mark.parametrize("fields, message", [
    (dict(n_experts=2, top_k=3), "top_k=3 must be in"), (dict(n_experts=2, capacity_factor=0), "capacity_factor"),
    (dict(n_experts=2, aux_loss_coef=-1), "aux_loss_coef=-1"),
    (dict(n_experts=2, capacity_factor=math.nan), r"^GPTConfig: capacity_factor=nan must be None \(dropless\) or a finite"),
    (dict(n_experts=2, capacity_factor=math.inf), "capacity_factor=inf must be None"),
    (dict(n_experts=2, moe_every=2), r"moe_every=2 must be in \[1, n_layer=1\].*a larger one places none")])
def test_bad_expert_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, d_model=8, **fields)
