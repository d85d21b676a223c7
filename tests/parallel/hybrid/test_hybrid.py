"""The 3D hybrid model (dp × tp × pp) on the threads backend: every layout equals one device."""
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

import minitensor as mt
import parallel
from minitensor import nn
from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPTConfig
from parallel import HybridGPT, Mesh, run_threads

sys.path.insert(0, str(Path(__file__).parents[1] / "mpi_scripts"))
from hybrid_common import check_against_single, make_batches, make_model, run_hybrid, run_single, tiny_config  # noqa: E402
from strategies import dualpipe_layouts, dualpipev_layouts, hybrid_layouts, seeds, zero_bubble_layouts, zero_layouts  # noqa: E402

STEPS = 3


def check_layout(layout, config, micro_batch, seq, accumulate, seed, steps=STEPS):
    """Run the layout on dp·tp·pp threads; every rank's history must equal one device's."""
    batch = layout["dp"] * layout["microbatches"] * micro_batch
    batches = make_batches(seed, config, batch, seq, steps * accumulate)
    world = layout["dp"] * layout["tp"] * layout["pp"]
    histories = run_threads(world, run_hybrid, layout, config, seed, batches, accumulate, timeout=60)
    ref = run_single(config, seed, batches, accumulate)
    for history in histories:  # every rank gathered the same dense view: dp replicas agree
        check_against_single(history, ref)


@given(drawn=hybrid_layouts(), seed=seeds)
def test_any_layout_equals_one_device_loss_gradients_and_adamw_steps(drawn, seed):
    check_layout(drawn["layout"], GPTConfig(**drawn["config"]), drawn["micro_batch"], drawn["seq"],
                 drawn["accumulate"], seed)


@settings(max_examples=10)  # each example trains up to 8 threads x 8 micro-batches x 3 steps
@given(drawn=zero_bubble_layouts(), seed=seeds)
def test_zero_bubble_schedules_in_3d_equal_one_device(drawn, seed):
    check_layout(drawn["layout"], GPTConfig(**drawn["config"]), drawn["micro_batch"], drawn["seq"],
                 drawn["accumulate"], seed)


@settings(max_examples=5)  # up to 8 threads x 10 micro-batches x 3 steps
@given(drawn=dualpipev_layouts(), seed=seeds)
def test_dualpipev_in_3d_equals_one_device(drawn, seed):
    check_layout(drawn["layout"], GPTConfig(**drawn["config"]), drawn["micro_batch"], drawn["seq"],
                 drawn["accumulate"], seed)


@settings(max_examples=5)  # up to 8 threads x 12 micro-batches x 3 steps
@given(drawn=dualpipe_layouts(), seed=seeds)
def test_bidirectional_dualpipe_in_3d_equals_one_device(drawn, seed):
    check_layout(drawn["layout"], GPTConfig(**drawn["config"]), drawn["micro_batch"], drawn["seq"],
                 drawn["accumulate"], seed)


def layout(dp=1, tp=1, pp=1, microbatches=1, schedule="1f1b", chunks=1, sequence_parallel=False,
           recompute_activations=False, zero=False):
    return dict(dp=dp, tp=tp, pp=pp, microbatches=microbatches, schedule=schedule, chunks=chunks,
                sequence_parallel=sequence_parallel, recompute_activations=recompute_activations, zero=zero)


# The classic boundary bugs of composing the three, each pinned by a fixed case.

@pytest.mark.parametrize("schedule, pp, m, chunks", [
    ("gpipe", 2, 3, 1), ("1f1b", 2, 1, 1), ("1f1b", 4, 2, 1), ("interleaved", 2, 2, 2)])
def test_dp_with_pp_under_every_schedule(schedule, pp, m, chunks):
    # 1F1B: the last stage never warms up, and with m < pp the first ones only warm up;
    # their backward passes still run inside no_sync, and the dp mean comes once after.
    spec = layout(dp=2, pp=pp, microbatches=m, schedule=schedule, chunks=chunks)
    check_layout(spec, tiny_config(spec), micro_batch=1, seq=4, accumulate=1, seed=3, steps=2)


def test_gradient_accumulation_across_train_steps_with_all_three_axes():
    spec = layout(dp=2, tp=2, pp=2, microbatches=2)
    check_layout(spec, tiny_config(spec), micro_batch=1, seq=4, accumulate=3, seed=4, steps=2)


def test_zero_with_pipeline_and_tensor_parallel():
    spec = layout(dp=2, tp=2, pp=2, microbatches=2, zero=True)
    check_layout(spec, tiny_config(spec), micro_batch=1, seq=4, accumulate=2, seed=5, steps=2)


def test_sequence_parallel_with_pipeline_and_recomputation():
    # Between stages the activation is this tp rank's (B, T/tp, C) slice of the sequence.
    spec = layout(tp=2, pp=2, microbatches=2, sequence_parallel=True, recompute_activations=True)
    check_layout(spec, tiny_config(spec), micro_batch=2, seq=6, accumulate=1, seed=6, steps=2)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_3_reduce_scatter_sequence_parallel_gradients_only_after_their_tp_sum(zero):
    # A LayerNorm's gradient under SP is partial on each tp rank until the stage's tp sum after the
    # schedule: its unit must not start its reduce-scatter in backward, however final it looks.
    spec = layout(dp=2, tp=2, microbatches=2, sequence_parallel=True, zero=zero)
    check_layout(spec, tiny_config(spec), micro_batch=1, seq=4, accumulate=1, seed=8, steps=2)


def test_each_rank_holds_its_stage_and_shard_under_single_device_names():
    spec = layout(tp=2, pp=2, chunks=2, schedule="interleaved", microbatches=2)
    config = tiny_config(spec, n_layer=4)

    def local_view():
        model = HybridGPT(make_model(config, 0), Mesh(1, 2, 2), microbatches=2, schedule="interleaved", chunks=2)
        named = model.named_parameters()
        sharded = {name: (p.tp_axis, p.full_shape) for name, p in named if hasattr(p, "tp_axis")}
        return model.mesh.coords, [stage.stage for stage in model.stages], [name for name, _ in named], sharded

    for (dp_rank, tp_rank, pp_rank, _), stage_ids, names, sharded in run_threads(4, local_view):
        assert stage_ids == [pp_rank, 2 + pp_rank]  # chunk c of pp rank r is stage c·pp + r
        blocks = sorted({int(name.split(".")[1]) for name in names if name.startswith("blocks.")})
        assert blocks == stage_ids  # balanced 4 blocks over 4 stages
        assert ("tok_emb.weight" in names) == (pp_rank == 0) and ("lm_head.weight" in names) == (pp_rank == 1)
        name = f"blocks.{stage_ids[0]}.attn.q.weight"
        assert sharded[name] == (0, (config.d_model, config.d_model))
        assert f"blocks.{stage_ids[0]}.ln_1.weight" not in sharded


def test_communication_is_counted_per_group_and_kind():
    spec = layout(dp=2, tp=2, pp=2, microbatches=2)
    config = tiny_config(spec)
    idx, targets = make_batches(0, config, 4, 4, 1)[0]

    def one_step():
        model = HybridGPT(make_model(config, 0), Mesh(2, 2, 2), microbatches=2)
        model.configure_optimizer()
        model.reset_communication_stats()
        model.train_step(idx, targets)
        model.optimizer_step()
        return model.communication_stats()

    for stats in run_threads(8, one_step):
        # Stage 0 sends m activations forward, stage 1 m gradients back: (1, 4, d_model) each.
        assert stats[("pp", "send")] == {"calls": 2, "elements": 2 * 4 * config.d_model,
                                         "bytes": 2 * 4 * config.d_model * 8}
        assert stats[("tp", "all_reduce")]["calls"] > 0  # the f / g of every block
        assert stats[("dp", "all_reduce")]["calls"] == 2  # one gradient bucket, once per step; the loss


def run_on_threads(world, fn):
    return run_threads(world, fn, timeout=30)


@pytest.mark.parametrize("dp, tp, pp, n_head, batch, seq, sp, message", [
    (2, 1, 2, 2, 6, 4, False, "global batch 6 is not divisible by dp=2 x microbatches=2"),
    (1, 2, 1, 3, 2, 4, False, "n_head=3 is not divisible by tp=2"),
    (1, 2, 1, 2, 2, 3, True, "sequence length 3 divisible by tp=2"),
])
def test_bad_layouts_are_clear_errors_on_every_rank(dp, tp, pp, n_head, batch, seq, sp, message):
    config = GPTConfig(vocab_size=7, block_size=8, n_layer=2, n_head=n_head, d_model=2 * n_head)
    idx = np.zeros((batch, seq), dtype=np.int64)
    errors = []

    def body():
        try:
            model = HybridGPT(make_model(config, 0), Mesh(dp, tp, pp), microbatches=2, sequence_parallel=sp)
            model.train_step(idx, idx)
        except ValueError as exc:
            errors.append(str(exc))

    run_on_threads(dp * tp * pp, body)
    assert len(errors) == dp * tp * pp and all(message in e for e in errors), errors


def test_a_mesh_that_does_not_cover_the_world_is_an_error():
    with pytest.raises(ValueError, match=r"dp=2 x tp=2 x pp=1 = 4 ranks, but the world has 2"):
        run_on_threads(2, lambda: Mesh(2, 2, 1))


def test_accumulating_after_the_sync_is_an_error():
    config = tiny_config(layout())
    idx = np.zeros((2, 4), dtype=np.int64)
    model = HybridGPT(make_model(config, 0), Mesh(world=parallel.world()))
    model.train_step(idx, idx)
    model.full_grads()  # finishes the sync
    with pytest.raises(RuntimeError, match="after the gradients were synced"):
        model.train_step(idx, idx)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_recomputation_with_tensor_parallel_dropout_recomputes_the_same_masks(sequence_parallel):
    # The recomputation must replay the TP dropout streams (replicated, sharded and its fork),
    # so recomputation changes nothing. Compared in the same layout and seed: dropout masks
    # depend on both, so the dense model is no reference here.
    spec = layout(tp=2, pp=2, microbatches=2, sequence_parallel=sequence_parallel)
    config = GPTConfig(**{**tiny_config(spec).__dict__, "dropout": 0.3})
    batches = make_batches(8, config, 4, 4, 2)

    def run(recompute_activations, seed=0):
        spec_run = dict(spec, recompute_activations=recompute_activations, seed=seed)
        return run_threads(4, run_hybrid, spec_run, config, 8, batches, 1, timeout=60)[0]

    plain, recomputed = run(False), run(True)
    check_against_single(recomputed, plain)
    other_masks = run(False, seed=1)
    assert other_masks[0][0] != plain[0][0]  # the masks matter: other streams, another loss


def test_each_stage_seeds_its_dropout_streams_with_the_run_seed_plus_its_index():
    # Stage s of a run with seed S: replicated stream default_rng([S + s, 0]) on every tp rank
    # (same masks where the activations are replicated), sharded stream default_rng([S + s, 1,
    # tp_rank]) (independent masks on each rank's own heads or positions). Stages differ.
    seed, dp, tp, pp, chunks = 11, 1, 2, 2, 2
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=4, n_head=2, d_model=8, dropout=0.1)

    def rank_fn():
        model = HybridGPT(make_model(config, 0), Mesh(dp, tp, pp), microbatches=2, schedule="interleaved",
                          chunks=chunks, seed=seed)
        draws = {}
        for stage in model.stages:
            replicated, sharded = stage.generators()
            dropouts = [m for m in stage.modules() if isinstance(m, nn.Dropout)]
            assert dropouts and all(m.generator in (replicated, sharded) for m in dropouts)
            draws[stage.stage] = (replicated.random(4), sharded.random(4))
        return model.mesh.tp_rank, draws

    drawn = {(tp_rank, stage): pair for tp_rank, draws in run_threads(dp * tp * pp, rank_fn, timeout=30)
             for stage, pair in draws.items()}
    assert sorted(drawn) == [(t, s) for t in range(tp) for s in range(pp * chunks)]
    for (tp_rank, stage), (replicated, sharded) in drawn.items():
        np.testing.assert_array_equal(replicated, np.random.default_rng([seed + stage, 0]).random(4))
        np.testing.assert_array_equal(sharded, np.random.default_rng([seed + stage, 1, tp_rank]).random(4))
    for stage in range(pp * chunks):  # what that means: tp ranks share only the replicated masks,
        np.testing.assert_array_equal(drawn[0, stage][0], drawn[1, stage][0])
        assert not np.array_equal(drawn[0, stage][1], drawn[1, stage][1])
        for other in range(stage):     # and no two stages draw alike
            assert not np.array_equal(drawn[0, stage][0], drawn[0, other][0])


# --- BERT: the same layers, other ends (a tied embedding, segments, MLM labels) ----------

@settings(max_examples=15)  # the GPT's layouts above cover the blocks; these the ends (with any ZeRO stage)
@given(drawn=zero_layouts(), seed=seeds)
def test_bert_in_any_layout_equals_one_device(drawn, seed):
    check_layout(drawn["layout"], BertConfig(**drawn["config"], sep_id=1), drawn["micro_batch"], drawn["seq"],
                 drawn["accumulate"], seed)


@pytest.mark.parametrize("spec", [layout(tp=2, pp=2, microbatches=2), layout(dp=2, pp=3, microbatches=3, zero=True),
                                  layout(tp=2, pp=2, microbatches=2, sequence_parallel=True),
                                  layout(dp=2, pp=2, microbatches=2, zero=2), layout(dp=2, tp=2, zero=2),
                                  layout(dp=2, pp=2, microbatches=2, zero=3), layout(dp=2, tp=2, microbatches=2, zero=3)])
def test_bert_with_its_embedding_and_head_on_different_stages_equals_one_device(spec):
    config = tiny_config(spec, config_class=BertConfig, vocab_size=9)
    check_layout(spec, config, micro_batch=2, seq=4, accumulate=1, seed=7, steps=2)


def test_zero_3_gathers_the_tied_embedding_for_the_head_and_reduce_scatters_it_once():
    # BERT on one stage: the MLM head reads tok_emb's weight, so its forward is a second use of the
    # tok_emb unit, gathered around the head (nested: it finishes first, so backward gathers it
    # second); both uses' gradients add into one .grad, reduce-scattered once with the others
    config = BertConfig(vocab_size=9, block_size=4, n_layer=1, n_head=2, d_model=4, sep_id=1)

    def rank_fn():
        mt.manual_seed(0)
        model = HybridGPT(BERT(config).double(), Mesh(2, 1, 1), zero=3)
        model.configure_optimizer()
        idx = np.random.default_rng(parallel.world().rank).integers(0, 9, (4, 4))
        model.reset_communication_stats()
        model.train_step(idx, idx)
        stats = model.communication_stats()
        return model.replicas.shardings[0].schedule(), stats[("dp", "reduce_scatter")]["calls"], len(model.replicas.buckets)

    for schedule, scatters, buckets in run_threads(2, rank_fn, timeout=60):
        units = ["tok_emb", "pos_emb", "seg_emb", "blocks.0", "ln_f", "mlm_head", "tok_emb"]
        assert schedule == [("forward", u) for u in units] + [("backward", u) for u in
                                                                 ["mlm_head", "tok_emb", *units[-3::-1]]]
        assert scatters == buckets == 6  # tok_emb, pos_emb, seg_emb, blocks.0, ln_f, mlm_head: once each
