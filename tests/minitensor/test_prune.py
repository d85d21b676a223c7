"""Pruning (minitensor.prune): magnitude masks reach the requested sparsity; removing heads or
neurons computes what zeroing them computes; the tp rule keeps the rest divisible."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
import parallel
from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from minitensor.prune import (
    MagnitudePruner,
    lowest_per_rank,
    magnitude_masks,
    prunable_weights,
    prune_heads,
    prune_neurons,
    units_to_prune,
)
from parallel import run_threads
from parallel.tensor_parallel import TensorParallelGPT


def gpt(seed=0, n_head=4, d_model=16):
    mt.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=n_head, d_model=d_model)).double()


def bert(seed=0):
    mt.manual_seed(seed)
    return BERT(BertConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16, sep_id=10)).double()


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 11, (3, 6)), rng.integers(0, 11, (3, 6))


@settings(max_examples=25)
@given(sparsity=st.floats(0.0, 0.95), scope=st.sampled_from(["global", "layer"]), seed=st.integers(0, 2**16))
def test_magnitude_pruning_reaches_the_requested_sparsity_exactly(sparsity, scope, seed):
    model = gpt(seed)
    pruner = MagnitudePruner(model, sparsity, scope)
    weights = prunable_weights(model)
    if scope == "global":
        total = sum(w.size for w in weights.values())
        assert sum(int((~m).sum()) for m in pruner.masks.values()) == round(sparsity * total)
        kept = np.concatenate([np.abs(w.data[m]) for w, m in zip(weights.values(), pruner.masks.values())])
        pruned = np.concatenate([np.abs(w.data[~m]) for w, m in zip(weights.values(), pruner.masks.values())])
        assert pruned.size == 0 or kept.size == 0 or (pruned == 0).all()  # zeroed now ...
    else:
        for name, w in weights.items():
            assert int((~pruner.masks[name]).sum()) == round(sparsity * w.size), name
    assert pruner.sparsity() == pytest.approx(sum(int((~m).sum()) for m in pruner.masks.values())
                                              / sum(w.size for w in weights.values()))


def test_global_scope_prunes_the_smallest_weights_of_all_matrices_together():
    model = gpt(1)
    before = {name: np.abs(w.data).copy() for name, w in prunable_weights(model).items()}
    masks = magnitude_masks(prunable_weights(model), 0.6, "global")
    largest_pruned = max(before[n][~m].max() for n, m in masks.items() if (~m).any())
    smallest_kept = min(before[n][m].min() for n, m in masks.items() if m.any())
    assert largest_pruned <= smallest_kept
    per_matrix = {n: (~m).mean() for n, m in masks.items()}  # ... so matrices lose different shares
    assert max(per_matrix.values()) - min(per_matrix.values()) > 0.1


def test_the_mask_is_reapplied_after_each_optimizer_step():
    model = gpt(2)
    pruner = MagnitudePruner(model, 0.75)
    optimizer = AdamW(model.parameters(), lr=1e-2)
    idx, targets = batch()
    for step in range(3):
        optimizer.zero_grad()
        model(idx, targets)[1].backward()
        optimizer.step()
        revived = sum(int((w.data[~pruner.masks[n]] != 0).sum()) for n, w in pruner.weights.items())
        assert revived > 0  # AdamW moved pruned weights ...
        pruner.apply()
        assert pruner.sparsity() == pytest.approx(0.75, abs=1e-3)  # ... and the mask zeroes them again


def test_bad_pruning_arguments_are_clear_errors():
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\), got 1.0"):
        MagnitudePruner(gpt(), 1.0)
    with pytest.raises(ValueError, match="scope must be one of"):
        MagnitudePruner(gpt(), 0.5, scope="row")
    with pytest.raises(ValueError, match=r"removing 3 of 4 under tp=2 must take the same number"):
        units_to_prune(gpt(), "heads", 3, tp=2)
    with pytest.raises(ValueError, match=r"can remove 0 to 3 of 4, got 4"):
        units_to_prune(gpt(), "heads", 4)
    with pytest.raises(ValueError, match="every block must lose as many"):
        prune_heads(gpt(), {0: [1], 1: [1, 2]})


def zero_heads(model, removed):
    d = model.config.head_dim
    for i, heads in removed.items():
        attn = model.blocks[i].attn
        for h in heads:
            rows = slice(h * d, (h + 1) * d)
            for lin in (attn.q, attn.k, attn.v):
                lin.weight.data[rows] = 0
                lin.bias.data[rows] = 0
            attn.proj.weight.data[:, rows] = 0


def zero_neurons(model, removed):
    for i, neurons in removed.items():
        mlp = model.blocks[i].mlp
        mlp.fc.weight.data[neurons] = 0
        mlp.fc.bias.data[neurons] = 0
        mlp.proj.weight.data[:, neurons] = 0


@pytest.mark.parametrize("make", [gpt, bert], ids=["gpt", "bert"])
@pytest.mark.parametrize("kind, count, tp", [("heads", 2, 2), ("heads", 1, 1), ("neurons", 40, 2), ("neurons", 7, 1)])
def test_the_physically_pruned_model_equals_the_masked_one(make, kind, count, tp):
    idx, targets = batch(3)
    if make is bert:
        targets = np.where(np.arange(6) % 3 == 0, targets, -100)
    pruned, masked = make(3), make(3)
    removed = units_to_prune(pruned, kind, count, tp)
    (prune_heads if kind == "heads" else prune_neurons)(pruned, removed)
    (zero_heads if kind == "heads" else zero_neurons)(masked, removed)
    logits, loss = pruned(idx, targets)
    ref_logits, ref_loss = masked(idx, targets)
    # The removed terms are exact zeros; BLAS may add the others in another order: equal to rounding.
    np.testing.assert_allclose(logits.data, ref_logits.data, rtol=1e-12, atol=1e-13)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    config = pruned.config
    assert (config.n_head, config.mlp_width) == ((4 - count, 64) if kind == "heads" else (4, 64 - count))
    assert config.head_dim == 4 and pruned.num_parameters() < masked.num_parameters()
    rebuilt = type(pruned)(config).double()  # the config describes the pruned shapes
    assert {n: p.shape for n, p in rebuilt.named_parameters()} == {n: p.shape for n, p in pruned.named_parameters()}


def test_the_tp_rule_takes_as_many_from_each_ranks_share():
    scores = np.array([5.0, 1.0, 2.0, 9.0, 0.5, 0.7, 8.0, 6.0])  # tp=2 shares: heads 0-3 and 4-7
    assert lowest_per_rank(scores, 2, 1, "heads") == [4, 5]
    assert lowest_per_rank(scores, 2, 2, "heads") == [1, 4]
    assert lowest_per_rank(scores, 4, 2, "heads") == [1, 2, 4, 5]


def test_a_pruned_model_runs_tensor_parallel_equal_to_one_device():
    idx, targets = batch(4)

    def pruned():
        model = gpt(4, n_head=6, d_model=24)
        prune_heads(model, units_to_prune(model, "heads", 2, tp=2))
        return prune_neurons(model, units_to_prune(model, "neurons", 10, tp=2))

    dense_loss = pruned()(idx, targets)[1].item()
    losses = run_threads(2, lambda: TensorParallelGPT(pruned(), parallel.world())(idx, targets)[1].item())
    assert losses == [pytest.approx(dense_loss, rel=1e-12)] * 2
    assert (pruned().config.n_head, pruned().config.mlp_width) == (4, 86)
