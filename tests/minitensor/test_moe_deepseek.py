"""DeepSeek-style routing in minitensor.nn.moe against a numpy reading of the papers' equations
(DeepSeekMoE: shared and fine-grained experts; DeepSeek-V3 eqs. 12–20: sigmoid scores, gates
normalised over the chosen, the bias that only picks, the sequence-wise balance loss; Wang et al.
2024: the loss-free update), in float64, with ties and experts nobody chose; backward against
central differences; the top-1 gate's task gradient (Switch), and the bias counted once under
recomputation."""
import numpy as np
import pytest
from hypothesis import given
from strategies import deepseek_routings

import minitensor as mt
from minitensor.gradcheck import gradcheck
from minitensor.nn.moe import MoE, top_k
from minitensor.nn.moe_balance import ExpertBias, max_violation
from minitensor.nn.moe_device_limit import limit_to_groups
from minitensor.recompute import recompute

D = 4


def layer_of(case):
    mt.manual_seed(case["seed"] % 1000)
    layer = MoE(D, case["width"], case["experts"], case["k"], case["renormalize"], aux_loss_coef=0.3,
                dtype=np.float64, shared_experts=case["shared"], router_score=case["score"],
                expert_groups=case["groups"], max_groups_per_token=case["limit"])
    rng = np.random.default_rng(case["seed"])
    for p in layer.parameters():
        p.data[...] = rng.normal(0, 0.7, p.shape)
    if case["tie"]:  # experts 0 and 1 score alike for every token: the lower index wins the tie
        layer.router.weight.data[1] = layer.router.weight.data[0]
    if case["bias"] is not None:
        layer.bias.value[...] = case["bias"]
        if case["tie"]:
            layer.bias.value[1] = layer.bias.value[0]
    return layer


def choose(selection, k, groups, limit):
    """Eq. 16's top-k of s + b (the lower index on a tie), among the experts of the `limit` groups
    whose ⌈k/limit⌉ best scores sum largest (DeepSeek-V3 §2.1.2)."""
    size, best = len(selection) // groups, -(-k // limit)  # ⌈k/limit⌉
    group_score = [sum(sorted(selection[g * size:(g + 1) * size])[-best:]) for g in range(groups)]
    kept = sorted(range(groups), key=lambda g: (-group_score[g], g))[:limit]
    allowed = [i for i in range(len(selection)) if i // size in kept]
    return sorted(allowed, key=lambda i: (-selection[i], i))[:k]


def reference(layer, case, x):
    """(y, balance loss, chosen experts) of tokens x (N, D), one sequence, from the equations."""
    logits = x @ layer.router.weight.data.T
    if case["score"] == "softmax":
        s = np.exp(logits - logits.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
    else:
        s = 1 / (1 + np.exp(-logits))  # eq. 15
    k, n_experts = case["k"], case["experts"]
    chosen = np.array([choose(s[t] + layer.bias.value, k, case["groups"], case["limit"]) for t in range(len(x))])
    y = np.zeros_like(x)
    for t, row in enumerate(chosen):
        gates = s[t, row]  # eq. 13: g = s (never s + b), normalised over the chosen
        if case["score"] == "sigmoid" or (case["renormalize"] and k > 1):
            gates = gates / gates.sum()
        y[t] = sum(g * layer.experts[e](mt.tensor(x[t:t + 1])).data[0] for e, g in zip(row, gates))
        if case["shared"]:
            y[t] += layer.shared(mt.tensor(x[t:t + 1])).data[0]  # eq. 12: every token, ungated
    f = n_experts / (k * len(x)) * np.bincount(chosen.reshape(-1), minlength=n_experts)  # eq. 18
    p = (s / s.sum(-1, keepdims=True)).mean(0)  # eqs. 19–20
    return y, 0.3 * (f * p).sum(), chosen  # eq. 17 with α = 0.3


@given(deepseek_routings())
def test_routing_equals_the_papers_equations_with_ties_and_idle_experts(case):
    layer = layer_of(case)
    x = np.random.default_rng(case["seed"] + 1).normal(size=(1, case["tokens"], D))
    y = layer(mt.tensor(x)).data[0]
    want, balance, chosen = reference(layer, case, x[0])
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(layer.aux_loss.item(), balance, rtol=1e-12)
    assert layer.load.tolist() == np.bincount(chosen.reshape(-1), minlength=case["experts"]).tolist()
    assert all(len(set(row // (case["experts"] // case["groups"]))) <= case["limit"] for row in chosen)


@given(deepseek_routings())
def test_backward_matches_central_differences(case):
    layer = layer_of(case)
    x = mt.tensor(np.random.default_rng(case["seed"] + 2).normal(size=(1, case["tokens"], D)), requires_grad=True)
    checked = [x, layer.experts[0].fc.weight] + ([] if case["tie"] else [layer.router.weight])
    checked += [layer.shared.proj.weight] if case["shared"] else []
    gradcheck(lambda *_: layer(x) + layer.aux_loss, *checked)


def test_a_top_1_gate_is_the_probability_so_the_router_learns_from_the_task():
    mt.manual_seed(0)
    layer = MoE(4, 6, 4, top_k=1, aux_loss_coef=0.0, dtype=np.float64)  # renormalize=True, the default
    (layer(mt.tensor(np.random.default_rng(0).normal(size=(2, 3, 4)))) ** 2).sum().backward()
    assert np.abs(layer.router.weight.grad).max() > 1e-3


def bias_after(load, rate, start=0.0):
    bias = ExpertBias(len(load), rate)
    bias.value[...], bias.load[...] = start, load
    bias.after_step()
    return bias


def test_the_bias_update_moves_against_the_load_in_float32():
    bias = bias_after([3, 1, 2, 6], 0.125)  # mean 3: at it, below, below, above
    assert bias.value.tolist() == [0.0, 0.125, 0.125, -0.125] and bias.max_violation == 1.0
    assert bias.value.dtype == np.float32 and bias.load.tolist() == [0, 0, 0, 0]
    assert bias_after([5, 5], 0.1, 0.3).value.tobytes() == np.float32([0.3, 0.3]).tobytes()
    assert bias_after([1, 3], 0.1, 0.3).value.tobytes() == (np.float32(0.3) + np.float32([0.1, -0.1])).tobytes()
    assert max_violation(np.array([3, 1, 2, 6])) == 1.0 and max_violation(np.array([2, 2])) == 0.0
    with pytest.raises(ValueError, match="expert_bias_rate=-0.1"):
        ExpertBias(4, -0.1)


def test_the_bias_picks_experts_but_never_weights_them():
    mt.manual_seed(0)
    layer = MoE(4, 6, 4, top_k=1, aux_loss_coef=0.0, dtype=np.float64)
    x = mt.tensor(np.random.default_rng(0).normal(size=(1, 5, 4)))
    layer.bias.value[...] = [0, 0, 0, 100]  # every token picks expert 3, with its gate p₃ (not p₃ + 100)
    y = layer(x).data[0]
    logits = x.data[0] @ layer.router.weight.data.T
    p3 = np.exp(logits[:, 3]) / np.exp(logits).sum(-1)
    want = p3[:, None] * layer.experts[3](mt.tensor(x.data[0])).data
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_a_recomputed_forward_counts_its_tokens_once_and_an_eval_forward_not_at_all():
    mt.manual_seed(0)
    layer = MoE(4, 6, 4, top_k=2, dtype=np.float64, expert_bias_rate=0.01)
    x = mt.tensor(np.random.default_rng(0).normal(size=(2, 3, 4)), requires_grad=True)
    recompute(layer, x).sum().backward()
    assert layer.bias.load.sum() == 2 * 3 * 2
    with mt.no_grad():
        layer(x)
    assert layer.bias.load.sum() == 2 * 3 * 2
    (updates,) = layer.step_updates()
    updates.after_step()
    assert layer.bias.load.sum() == 0 and layer.bias.value.dtype == np.float32 and abs(layer.bias.value).max() == 0.01


def test_device_limited_selection_keeps_the_groups_whose_best_scores_sum_largest():
    scores = np.array([[0.9, 0.1, 0.5, 0.5, 0.8, 0.3]])  # groups {0, 1}, {2, 3}, {4, 5}
    pick = lambda limit: top_k(limit_to_groups(scores, 2, 3, limit), 2).tolist()  # noqa: E731
    assert pick(2) == [[0, 4]]  # ⌈2/2⌉ = 1 best each: 0.9, 0.5, 0.8 → groups 0 and 2
    assert pick(1) == [[4, 5]]  # ⌈2/1⌉ = 2 best each: 1.0, 1.0, 1.1 → group 2 alone
    assert top_k(limit_to_groups(scores[:, :4], 2, 2, 1), 2).tolist() == [[0, 1]]  # 1.0 = 1.0: the lower group
    assert np.array_equal(limit_to_groups(scores, 2, 3, 3), scores)  # M = G: no limit
