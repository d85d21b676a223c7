"""What a TP GPT is made of and what it costs: every layer that should be parallel is (types,
shard shapes), per-rank parameter memory, and the collectives of one training step per
transformer layer, as the Megatron-LM and sequence-parallelism papers predict."""
import numpy as np
import pytest

import minitensor as mt
import parallel
from minitensor import nn
from minitensor.models import GPT, GPTConfig
from parallel import (
    ColumnParallelLinear,
    ParallelBlock,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    TensorParallelGPT,
    VocabParallelEmbedding,
)
from parallel.tensor_parallel import mappings

B, S, D, HEADS, VOCAB = 2, 4, 8, 4, 10
# Parameters the paper splits (column-parallel q, k, v, fc with their biases; row-parallel
# weights; the vocabulary). Everything else is replicated.
SHARDED = ("attn.q.", "attn.k.", "attn.v.", "mlp.fc.", "attn.proj.weight", "mlp.proj.weight", "tok_emb", "lm_head")


def dense_gpt(n_layer):
    mt.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=S, n_layer=n_layer, n_head=HEADS, d_model=D)).double()


def one_step_stats(n_layer, tp, sp):
    """Per-rank stats of one forward + backward + finish_grad_sync on the tp group."""
    gpt = dense_gpt(n_layer)
    idx = np.random.default_rng(0).integers(0, VOCAB, (B, S))

    def rank():
        group = parallel.world()
        model = TensorParallelGPT(gpt, group, sequence_parallel=sp)
        group.reset_stats()
        _, loss = model(idx, idx)
        loss.backward()
        model.finish_grad_sync()
        return group.stats()
    return parallel.run_threads(tp, rank, timeout=60)[0]


def per_layer(tp, sp):
    """Stats of a 2-layer step minus a 1-layer step: what one transformer layer adds."""
    one, two = one_step_stats(1, tp, sp), one_step_stats(2, tp, sp)
    zero = {"calls": 0, "elements": 0, "bytes": 0}
    diff = {kind: {key: two.get(kind, zero)[key] - one.get(kind, zero)[key] for key in zero}
            for kind in set(one) | set(two)}
    return {kind: counts for kind, counts in diff.items() if any(counts.values())}


@pytest.mark.parametrize("tp", [2, 4])
def test_without_sp_a_layer_all_reduces_its_activation_twice_forward_and_twice_backward(tp):
    bsh = B * S * D
    assert per_layer(tp, sp=False) == {
        "all_reduce": {"calls": 4, "elements": 4 * bsh, "bytes": 4 * (2 * (tp - 1) * bsh * 8 // tp)}}


@pytest.mark.parametrize("tp", [2, 4])
def test_with_sp_all_gathers_and_reduce_scatters_move_the_same_bytes(tp):
    bsh = B * S * D
    layer = per_layer(tp, sp=True)
    # The partial gradients of the layer's two LayerNorms and two row-parallel biases join the
    # model's single flat all-reduce of partial gradients: more elements, no more calls.
    assert layer == {
        "all_gather": {"calls": 4, "elements": 4 * bsh, "bytes": 4 * ((tp - 1) * bsh * 8 // tp)},
        "reduce_scatter": {"calls": 4, "elements": 4 * bsh, "bytes": 4 * ((tp - 1) * bsh * 8 // tp)},
        "all_reduce": {"calls": 0, "elements": 6 * D, "bytes": 2 * (tp - 1) * 6 * D * 8 // tp}}
    activation_bytes = layer["all_gather"]["bytes"] + layer["reduce_scatter"]["bytes"]
    assert activation_bytes == per_layer(tp, sp=False)["all_reduce"]["bytes"]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_per_rank_parameter_bytes_are_the_sharded_share_plus_the_replicated(tp):
    gpt = dense_gpt(2)
    padded_vocab = -(-VOCAB // tp) * tp
    sharded = replicated = 0
    for name, p in gpt.named_parameters():
        if any(part in name for part in SHARDED):
            sharded += p.data.nbytes * (padded_vocab / VOCAB if name.startswith(("tok_emb", "lm_head")) else 1)
        else:
            replicated += p.data.nbytes
    per_rank = parallel.run_threads(
        tp, lambda: sum(p.data.nbytes for p in TensorParallelGPT(gpt, parallel.world()).parameters()), timeout=60)
    assert per_rank == [sharded / tp + replicated] * tp


@pytest.mark.parametrize("sp", [False, True])
def test_every_layer_that_should_be_parallel_is(sp):
    gpt, tp = dense_gpt(2), 2
    dense_shapes = {name: p.shape for name, p in gpt.named_parameters()}

    def rank():
        model = TensorParallelGPT(gpt, parallel.world(), sequence_parallel=sp)
        return ({name: type(m) for name, m in model.named_modules()},
                {name: (p.shape, getattr(p, "tp_axis", None), getattr(p, "full_shape", None),
                        getattr(p, "tp_partial_grad", False)) for name, p in model.named_parameters()})

    for types, params in parallel.run_threads(tp, rank, timeout=60):
        assert list(params) == list(dense_shapes)  # the single-device names, in the same order
        assert not [name for name, t in types.items() if t is nn.Linear]
        assert [name for name, t in types.items() if t is nn.Embedding] == ["pos_emb"]
        assert types["tok_emb"] is VocabParallelEmbedding and types["lm_head"] is ColumnParallelLinear
        for i in range(2):
            block = f"blocks.{i}"
            assert types[block] is ParallelBlock and types[f"{block}.attn"] is ParallelSelfAttention
            assert types[f"{block}.mlp"] is ParallelMLP
            for name in ("attn.q", "attn.k", "attn.v", "mlp.fc"):
                assert types[f"{block}.{name}"] is ColumnParallelLinear
            for name in ("attn.proj", "mlp.proj"):
                assert types[f"{block}.{name}"] is RowParallelLinear
        for name, (shape, axis, full_shape, partial) in params.items():
            dense = dense_shapes[name]
            if any(part in name for part in SHARDED):
                local = -(-dense[axis] // tp)
                assert full_shape == dense and shape == dense[:axis] + (local,) + dense[axis + 1:], name
                assert axis == (1 if name.endswith("proj.weight") else 0), name
            else:
                assert (shape, axis, full_shape) == (dense, None, None), name
                # Under SP, a replicated parameter sees only this rank's positions: partial gradient.
                assert partial == (sp and "lm_head" not in name), name


@pytest.mark.parametrize("tp", [2, 4])
def test_load_full_state_dict_keeps_each_ranks_shards_and_gathers_back_the_original_shapes(tp):
    source = dense_gpt(1)
    mt.manual_seed(1)
    state = GPT(source.config).double().state_dict()

    def rank():
        model = TensorParallelGPT(source, parallel.world())
        model.load_full_state_dict(state)
        gathered = model.full_state_dict()
        with pytest.raises(ValueError, match=r"'lm_head.weight' has shape \(9, 8\) in the checkpoint but \(10, 8\)"):
            model.load_full_state_dict({**state, "lm_head.weight": state["lm_head.weight"][:-1]})
        return gathered

    for gathered in parallel.run_threads(tp, rank, timeout=60):
        assert list(gathered) == list(state)
        for name in state:
            np.testing.assert_array_equal(gathered[name], state[name])


@pytest.mark.parametrize("mapping", [mappings.copy_to_tensor_model_parallel_region,
                                     mappings.reduce_from_tensor_model_parallel_region,
                                     mappings.scatter_to_tensor_model_parallel_region,
                                     mappings.gather_from_tensor_model_parallel_region,
                                     mappings.gather_from_sequence_parallel_region,
                                     mappings.reduce_scatter_to_sequence_parallel_region])
def test_on_one_rank_every_mapping_is_skipped_and_on_two_it_is_a_node(mapping):
    """tp = 1: the identity, so no node and no copy (the input comes back itself), as in
    Megatron-LM; tp = 2: a node of the graph."""
    x = mt.tensor(np.ones((2, 4, 6)), requires_grad=True)
    assert mapping(x, parallel.world()) is x
    made = parallel.run_threads(2, lambda: mapping(x, parallel.world())._node is not None)
    assert made == [True, True]
