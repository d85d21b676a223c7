"""The balancing loss's two scopes against numpy readings of the papers, forward and backward, in
float64: "batch" is Switch Transformer's eqs. 4–6 over every token of the batch (f the share of
the k·T assignments, so top-k as Megatron's aux_loss), "sequence" DeepSeek-V3's eqs. 17–20 per
sequence, averaged over the sequences; with one sequence the two are one loss."""
import numpy as np
import pytest
from hypothesis import given
from strategies import aux_loss_cases

import minitensor as mt
from minitensor.nn.moe import MoE

D, ALPHA = 3, 0.3


def layer_of(case, scope=None):
    mt.manual_seed(0)
    layer = MoE(D, 2, case["experts"], case["k"], aux_loss_coef=ALPHA, dtype=np.float64, router_score=case["score"],
                aux_loss_scope=scope or case["scope"])
    layer.router.weight.data[...] = np.random.default_rng(case["seed"]).normal(0, 1.0, layer.router.weight.shape)
    return layer


def scores(case, weight, x):
    logits = x @ weight.T
    if case["score"] == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def chosen_experts(case, weight, x):
    """Each token's k experts of largest score, the lower index on a tie."""
    s = scores(case, weight, x)
    return np.array([sorted(range(case["experts"]), key=lambda i: (-row[i], i))[:case["k"]] for row in s])


def switch_loss(case, s, chosen):
    """Switch eqs. 4–6 over all T tokens of the batch: α·N·Σᵢ fᵢ·Pᵢ, fᵢ the share of the T·k
    assignments that chose i, Pᵢ the mean normalised score."""
    n_experts, tokens = case["experts"], len(s)
    f = np.bincount(chosen.reshape(-1), minlength=n_experts) / (tokens * case["k"])  # eq. 5
    p = (s / s.sum(-1, keepdims=True)).mean(0)  # eq. 6
    return ALPHA * n_experts * (f * p).sum()  # eq. 4


def deepseek_loss(case, s, chosen):
    """DeepSeek-V3 eqs. 17–20 for one sequence: α·Σᵢ fᵢ·Pᵢ, fᵢ = N_r/(K_r·T)·#{t: i in t's top-k},
    Pᵢ the mean of s'ᵢ,t = sᵢ,t / Σⱼ sⱼ,t."""
    n_experts, tokens = case["experts"], len(s)
    f = n_experts / (case["k"] * tokens) * np.bincount(chosen.reshape(-1), minlength=n_experts)  # eq. 18
    p = (s / s.sum(-1, keepdims=True)).mean(0)  # eqs. 19–20
    return ALPHA * (f * p).sum()  # eq. 17


def reference(case, weight, x, chosen):
    """The scope's loss of x (B, T, D) with the experts `chosen` (B·T, k) held fixed."""
    b, t, _ = x.shape
    s = scores(case, weight, x.reshape(b * t, D))
    if case["scope"] == "batch":
        return switch_loss(case, s, chosen)
    return np.mean([deepseek_loss(case, s[i * t:(i + 1) * t], chosen[i * t:(i + 1) * t]) for i in range(b)])


def central_differences(f, w, h=1e-6):
    grad = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        up, down = w.copy(), w.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


@given(aux_loss_cases())
def test_each_scope_equals_its_papers_equations_forward_and_backward(case):
    layer = layer_of(case)
    x = np.random.default_rng(case["seed"] + 1).normal(size=(case["sequences"], case["tokens"], D))
    layer(mt.tensor(x))
    weight = layer.router.weight.data.copy()
    chosen = chosen_experts(case, weight, x.reshape(-1, D))
    assert layer.chosen.tolist() == chosen.tolist()
    np.testing.assert_allclose(layer.aux_loss.item(), reference(case, weight, x, chosen), rtol=1e-12)
    layer.aux_loss.backward()
    want = central_differences(lambda w: reference(case, w, x, chosen), weight)
    np.testing.assert_allclose(layer.router.weight.grad, want, rtol=1e-6, atol=1e-9)


@given(aux_loss_cases())
def test_with_one_sequence_the_batch_scope_is_the_sequence_scope(case):
    x = mt.tensor(np.random.default_rng(case["seed"] + 2).normal(size=(1, case["tokens"], D)))
    sequence, batch = layer_of(case, "sequence"), layer_of(case, "batch")
    for layer in (sequence, batch):
        layer(x)
        layer.aux_loss.backward()
    assert batch.aux_loss.item() == sequence.aux_loss.item()
    np.testing.assert_array_equal(batch.router.weight.grad, sequence.router.weight.grad)


def test_the_scopes_differ_when_sequences_keep_to_their_own_experts():
    """Two sequences, each sending all its tokens to an expert of its own: each sequence is as
    unbalanced as it can be (f = (1, 0): α·E·p), while the batch is balanced (f = P = ½: α)."""
    case = dict(experts=2, k=1, score="softmax", seed=0)
    layers = {scope: layer_of(case, scope) for scope in ("sequence", "batch")}
    x = np.zeros((2, 3, D))
    x[0, :, 0], x[1, :, 0] = 1.0, -1.0
    for layer in layers.values():
        layer.router.weight.data[...] = [[5.0, 0, 0], [-5.0, 0, 0]]
        layer(mt.tensor(x))
    p = 1 / (1 + np.exp(-10.0))  # each token's probability of its own expert
    assert layers["sequence"].aux_loss.item() == pytest.approx(ALPHA * 2 * p, rel=1e-12)
    assert layers["batch"].aux_loss.item() == pytest.approx(ALPHA, rel=1e-12)


def test_an_unknown_scope_is_one_clear_error():
    with pytest.raises(ValueError, match="aux_loss_scope='token' is not one of"):
        MoE(4, 6, 4, aux_loss_scope="token")
