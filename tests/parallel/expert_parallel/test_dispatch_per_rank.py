"""The all-to-all dispatch sends one row per (token, rank): forward and backward equal one device
(LocalDispatcher) to 1e-12 in float64, with capacity, ties, experts nobody chose and the device
limit; and the rows it counts are, per destination, the tokens with a kept expert there."""
import numpy as np
from hypothesis import given
from strategies import expert_dispatches

import minitensor as mt
from minitensor.nn.moe import MoE, Routing, capacity, within_capacity
from parallel.comm import run_threads, world
from parallel.expert_parallel.dispatch import AllToAllDispatcher, local_experts, rows_per_rank

D, WIDTH = 4, 3


def test_a_token_goes_once_to_each_rank_of_its_kept_experts():
    # 3 tokens, top-2 of 4 experts on 2 ranks (0, 1 on rank 0; 2, 3 on rank 1); token 2's expert 2 is dropped
    routing = Routing(token=np.repeat(np.arange(3), 2), expert=np.array([0, 1, 2, 0, 3, 2]), weight=None,
                      kept=np.array([True, True, True, True, True, False]))
    rank, token, row, local = rows_per_rank(routing, n_tokens=3, n_local=2)
    assert rank.tolist() == [0, 0, 1, 1] and token.tolist() == [0, 1, 1, 2]  # token 0 goes to rank 0 once
    assert row.tolist() == [0, 0, 2, 1, 3] and local.tolist() == [0, 1, 0, 0, 1]  # per kept assignment


def layer_of(case, group=None):
    """The case's MoE layer, the same weights on every rank; under `group` it keeps its share of
    the experts and reaches the others by all-to-all."""
    mt.manual_seed(0)
    layer = MoE(D, WIDTH, case["experts"], case["k"], capacity_factor=case["capacity"], aux_loss_coef=0.2,
                dtype=np.float64, router_score=case["score"], expert_groups=case["ep"],
                max_groups_per_token=case["limit"])
    rng = np.random.default_rng(case["seed"])
    for p in layer.parameters():
        p.data[...] = rng.normal(0, 0.8, p.shape)
    if case["tie"]:  # experts 0 and the last score alike for every token: the lower index wins
        layer.router.weight.data[-1] = layer.router.weight.data[0]
    if group is not None:
        layer.experts, layer.dispatcher = local_experts(layer.experts, group), AllToAllDispatcher(group)
    return layer


def tokens(case, rank):
    rng = np.random.default_rng([case["seed"], rank])
    return rng.normal(size=(case["sequences"], case["tokens"], D)), rng.normal(size=(case["sequences"], case["tokens"], D))


def forward_backward(layer, x, probe):
    """(y, dx, {name: grad}) of Σ y·probe + the balancing loss."""
    x = mt.tensor(x, requires_grad=True)
    y = layer(x)
    ((y * mt.tensor(probe)).sum() + layer.aux_loss).backward()
    return y.data, x.grad, {name: np.zeros_like(p.data) if p.grad is None else p.grad  # an expert nobody chose
                            for name, p in layer.named_parameters()}


def expected_rows(case, layer):
    """Rows this rank sends each rank: its tokens with at least one kept expert there."""
    chosen, k, per_rank = layer.chosen, case["k"], case["experts"] // case["ep"]
    kept = np.ones(chosen.size, bool)
    if case["capacity"] is not None:
        kept = within_capacity(chosen, case["tokens"], capacity(case["tokens"], k, case["experts"], case["capacity"]))
    reached = np.zeros((len(chosen), case["ep"]), bool)
    reached[np.repeat(np.arange(len(chosen)), k)[kept], chosen.reshape(-1)[kept] // per_rank] = True
    return reached.sum(axis=0)


@given(expert_dispatches())
def test_the_dispatch_per_token_and_rank_equals_one_device(case):
    ep, per_rank = case["ep"], case["experts"] // case["ep"]
    reference = [forward_backward(layer_of(case), *tokens(case, rank)) for rank in range(ep)]
    one_device = {name: sum(r[2][name] for r in reference) for name in reference[0][2]}

    def on_rank():
        group = world()
        layer = layer_of(case, group)
        group.reset_stats()
        y, dx, grads = forward_backward(layer, *tokens(case, group.rank))
        return y, dx, grads, layer.dispatcher.sent, layer.dispatcher.received, expected_rows(case, layer), \
            group.stats().get("all_to_all", {}).get("bytes", 0)
    results = run_threads(ep, on_rank)
    for rank, (y, dx, grads, sent, received, expected, counted) in enumerate(results):
        np.testing.assert_allclose(y, reference[rank][0], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(dx, reference[rank][1], rtol=1e-12, atol=1e-13)
        for name, grad in grads.items():  # an expert's sums every rank's tokens; the router's is this rank's
            want = one_device[name] if name.startswith("experts.") else reference[rank][2][name]
            np.testing.assert_allclose(grad, want, rtol=1e-12, atol=1e-13, err_msg=name)
        assert sent.tolist() == expected.tolist()
        assert received.tolist() == [results[source][5][rank] for source in range(ep)]
        others = sent.sum() - sent[rank] + received.sum() - received[rank]  # a rank's rows to itself stay home
        assert counted == others * (2 * D + per_rank) * 8 + (ep - 1) * 8
