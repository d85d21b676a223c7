"""ZeRO-2 and ZeRO-3 (parallel.data_parallel.fully_sharded) on the threads backend: one device's AdamW, with
1/n of the gradients (and, stage 3, of the parameters) per rank; the 3D layouts with any stage."""
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
import parallel
from minitensor import nn
from minitensor.models.gpt import GPTConfig
from parallel import DataParallel, FullyShardedDataParallel, HybridGPT, Mesh, run_threads
from parallel.data_parallel.gather_order import check_gathers, gathers_due

sys.path.insert(0, str(Path(__file__).parents[1] / "mpi_scripts"))
from dp_common import check_fully_sharded, make_data, run_fully_sharded, run_single, run_zero  # noqa: E402
from helpers import assert_close  # noqa: E402
from hybrid_common import check_against_single, make_batches, make_model, run_hybrid  # noqa: E402
from hybrid_common import run_single as run_single_gpt  # noqa: E402
from strategies import seeds, zero_layouts  # noqa: E402

STEPS = 3


def train_and_check(model_name, seed, n, micro, stage, prefetch=1):
    data = make_data(seed, n, micro, 2, STEPS)
    ref = run_single(model_name, seed, data)
    runs = run_threads(n, lambda: run_fully_sharded(parallel.world(), model_name, seed, data, micro, stage, prefetch),
                       timeout=60)
    for run in runs:
        check_fully_sharded(run, ref, n, stage, STEPS)


@settings(max_examples=15)
@given(n=st.integers(1, 4), micro=st.integers(1, 3), stage=st.sampled_from([2, 3]), prefetch=st.integers(0, 2),
       seed=seeds)
def test_frozen_tied_and_twice_used_parameters_equal_adamw_on_one_device(n, micro, stage, prefetch, seed):
    train_and_check("tiny", seed, n, micro, stage, prefetch)


@pytest.mark.parametrize("stage", [2, 3])
def test_gpt_equals_adamw_on_one_device(stage):
    train_and_check("gpt", 11, 3, micro=2, stage=stage)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_moments_equal_one_device_keeping_bf16_moments(stage):
    """ZeroOptimizer (stage 1) and FSDP (2, 3) with bfloat16 moments: one device's AdamW with the
    same moments (the store rounds each element alone), half the moment bytes of float64's / 4."""
    data = make_data(5, 2, 1, 2, STEPS)
    ref, wide = run_single("gpt", 5, data, "bfloat16"), run_single("gpt", 5, data)
    run = run_zero if stage == 1 else lambda *a, **k: run_fully_sharded(*a, stage=stage, **k)
    runs = run_threads(2, lambda: run(parallel.world(), "gpt", 5, data, 1, moment_dtype="bfloat16"), timeout=60)
    for result in runs:
        for name, value in ref["final"].items():
            assert_close(result["final"][name], value, f"{name} after {STEPS} steps")
        held = result["state_bytes"] if stage == 1 else result["memory"]["optim"]
        assert abs(held - ref["state_bytes"] / 2) <= 2 * 2  # each rank: half the bf16 moments, up to the padding
    assert max(float(np.abs(wide["final"][n] - v).max()) for n, v in ref["final"].items()) > 1e-6


@settings(max_examples=12)  # each example trains up to 8 threads x 3 steps
@given(drawn=zero_layouts(), seed=seeds)
def test_any_3d_layout_with_any_zero_stage_equals_one_device(drawn, seed):
    layout, config = drawn["layout"], GPTConfig(**drawn["config"])
    batch = layout["dp"] * layout["microbatches"] * drawn["micro_batch"]
    batches = make_batches(seed, config, batch, drawn["seq"], 3 * drawn["accumulate"])
    world = layout["dp"] * layout["tp"] * layout["pp"]
    histories = run_threads(world, run_hybrid, layout, config, seed, batches, drawn["accumulate"], timeout=60)
    ref = run_single_gpt(config, seed, batches, drawn["accumulate"])
    for history in histories:
        check_against_single(history, ref)


class Branchy(nn.Module):
    """Three units in a row; with `skip` the loss bypasses the first, as one rank's data may."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.head = nn.Linear(4, 5), nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x, skip):
        hidden = self.first(mt.tensor(x)).tanh()  # runs on every rank (its all-gathers too) ...
        if skip:  # ... but this rank's loss never reads it: its backward gather is never needed here
            hidden = mt.tensor(np.ones(hidden.shape))
        return self.head(self.second(hidden).tanh()).sum()


def test_a_unit_one_ranks_loss_does_not_reach_neither_deadlocks_nor_changes_the_result():
    # Accumulating under no_sync, the next forward's gathers follow this backward's: had rank 1
    # left the skipped unit's backward gather for later, every gather after it would pair with
    # another unit's on rank 0 (the last-in-backward unit: the case real implementations hang on).
    def rank_fn(stage):
        group = parallel.world()
        mt.manual_seed(2)
        model = Branchy().double()
        wrapped = (FullyShardedDataParallel(model, group, stage=3, units=["first", "second", "head"], prefetch=0)
                   if stage else DataParallel(model, group))  # prefetch 0: no gather ahead hides the bug
        rng = np.random.default_rng(group.rank)
        with wrapped.no_sync():
            for _ in range(2):
                wrapped(rng.normal(size=(2, 4)), skip=group.rank == 1).backward()
        wrapped(rng.normal(size=(2, 4)), skip=group.rank == 1).backward()
        return wrapped.full_grads() if stage else {n: p.grad for n, p in model.named_parameters()}

    sharded, plain = run_threads(2, rank_fn, 3, timeout=30), run_threads(2, rank_fn, 0, timeout=30)
    for name, grad in plain[0].items():  # DataParallel: equal to one device (test_ddp)
        assert_close(sharded[0][name], grad, name)


def test_the_gather_order_is_the_same_on_ranks_whose_backward_reads_different_uses():
    # A pass of 5 uses (a tied unit appears twice); rank 1 never reads uses 1 and 4, rank 2 none.
    needed = [[True] * 5, [True, False, True, True, False], [False] * 5]
    for prefetch in range(3):
        assert check_gathers(needed, prefetch) == [list(range(5))] * 3
    # issuing only what a rank reads would desynchronise the ranks: the checker says so
    with pytest.raises(ValueError, match="deadlock|different gather sequences"):
        check_gathers_reading_only(needed)


def check_gathers_reading_only(needed_by_rank):
    sequences = [[k for k, read in enumerate(needed) if read] for needed in needed_by_rank]
    if any(s != sequences[0] for s in sequences):
        raise ValueError(f"ranks issue different gather sequences: {sequences}")


def test_gathers_due_issues_in_order_with_prefetch_and_the_unread_tail():
    assert gathers_due([True, True, True, True], [False] * 4, 0, 1) == [0, 1]
    assert gathers_due([True, False, True, False], [True, False, False, False], 2, 0) == [1, 2, 3]
    assert gathers_due([True, True, False], [True, True, False], 1, 0) == [2]


def test_stage_3_keeps_one_nth_of_the_parameters_and_nan_placeholders_between_steps():
    def rank_fn():
        group = parallel.world()
        mt.manual_seed(0)
        model = Branchy().double()
        fsdp = FullyShardedDataParallel(model, group, stage=3, units=["first", "second", "head"])
        held = [b.param_shard.size for b in fsdp.reducer.buckets]
        return held, [bool(np.isnan(p.data).all()) for p in model.parameters()], fsdp.sharding.schedule()

    for held, freed, schedule in run_threads(3, rank_fn, timeout=30):  # head, second, first: ceil(numel / 3)
        assert held == [-(-(6 * 3 + 3) // 3), -(-(5 * 6 + 6) // 3), -(-(4 * 5 + 5) // 3)] and all(freed)
        assert schedule == [("forward", "first"), ("forward", "second"), ("forward", "head"),
                            ("backward", "head"), ("backward", "second"), ("backward", "first")]


@pytest.mark.parametrize("stage, units, message", [
    (4, (), "stage=4 is not 2 or 3"),
    (3, ["nope"], r"units \['nope'\] are not submodules"),
])
def test_bad_arguments_are_clear_errors(stage, units, message):
    with pytest.raises(ValueError, match=message):
        FullyShardedDataParallel(Branchy(), parallel.world(), stage=stage, units=units)


@pytest.mark.parametrize("numel, n", [(2, 7), (5, 4), (12, 4), (1, 1)])
def test_every_rank_gets_a_full_chunk_of_the_padded_values_however_small_the_unit(numel, n):
    # 2 elements over 7 ranks: chunks of 1, ranks 2..6 hold padding only (a buffer of numel +
    # shard_size elements gave rank 6 an empty chunk, and AdamW a shape mismatch)
    from parallel.data_parallel.reducer import Bucket, padded_length, values_chunk
    bucket = Bucket([nn.Parameter(np.arange(1.0, numel + 1))], length=padded_length(numel, n))
    bucket.shard_size = bucket.buffer.size // n
    chunks = [values_chunk(bucket, rank) for rank in range(n)]
    assert all(chunk.shape == (bucket.shard_size,) for chunk in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks)[:numel], np.arange(1.0, numel + 1))
    assert not np.concatenate(chunks)[numel:].any()


# --- HybridGPT: each unit's reduce-scatter starts inside backward ---------------------------

GPT_CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)


def one_batch(layout, m):
    """(dp bucket events, end of the schedule's last action, dp bytes, padded elements) of a
    HybridGPT's first global batch (8 sequences of 8 tokens) on this rank."""
    model = HybridGPT(make_model(GPT_CONFIG, 3), Mesh(layout["dp"], 1, layout["pp"]), microbatches=m,
                      zero=layout["zero"], schedule=layout.get("schedule", "1f1b"))
    model.configure_optimizer()
    idx = np.random.default_rng(parallel.world().rank).integers(0, GPT_CONFIG.vocab_size, (8, 8))
    model.reset_communication_stats()
    model.train_step(idx, idx)
    events = model.events()
    schedule_end = max(e.end for e in events if e.kind != "dp_bucket")
    dp_bytes = sum(c["bytes"] for (name, _), c in model.communication_stats().items() if name == "dp")
    padded = sum(b.shard_size * model.mesh.dp for b in model.replicas.buckets)
    return [e for e in events if e.kind == "dp_bucket"], schedule_end, dp_bytes, padded, len(model.replicas.buckets)


@pytest.mark.parametrize("layout", [dict(dp=2, pp=1, zero=2), dict(dp=2, pp=2, zero=3),
                                    dict(dp=2, pp=2, zero=3, schedule="zb-h1")], ids=["zero2", "zero3-pp2", "zb-h1"])
def test_every_units_reduce_scatter_starts_before_the_schedule_ends(layout):
    # After the schedule only the waits are left: each unit's reduce-scatter was issued from the
    # gradient hook of its last micro-batch's backward (zb-h1: its W), while the backward of the
    # units before it still ran. (Issued after the schedule, every start would be past its end.)
    world = layout["dp"] * layout["pp"]
    for buckets, schedule_end, _, _, count in run_threads(world, one_batch, layout, 2, timeout=60):
        assert len(buckets) == count
        assert all(bucket.start < schedule_end for bucket in buckets), (schedule_end, buckets)


@pytest.mark.parametrize("zero, m", [(2, 1), (2, 4), (3, 1), (3, 2), (3, 4)])
def test_dp_bytes_per_batch_equal_the_formula_at_any_micro_batch_count(zero, m):
    # one reduce-scatter of every unit per global batch, whatever m; ZeRO-2's all-gather comes with
    # the optimizer step (not here), ZeRO-3 gathers every unit for each micro-batch's forward and
    # backward: 2m + 1 passes of Ψ(n-1)/n, 1.5x ZeRO-2's step at m = 1 (+ the loss's all-reduce)
    n = 2
    for _, _, dp_bytes, padded, _ in run_threads(n, one_batch, dict(dp=n, pp=1, zero=zero), m, timeout=60):
        passes = 2 * m + 1 if zero == 3 else 1
        assert dp_bytes == passes * padded * (n - 1) // n * 8 + (n - 1) * 8 * 2 // n
