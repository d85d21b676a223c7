"""Per-rank memory: parameter/gradient/optimizer bytes and Korthikanti activations."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
from minitensor import dtypes
from minitensor.models.gpt import GPT, GPTConfig
from parallel import HybridGPT, Mesh, run_threads
from parallel.pipeline import check_schedule, get_schedule
from parallel.plan import Layout, get_config, param_bytes_per_rank
from parallel.plan.memory import (
    activation_bytes_per_rank,
    block_activation_bytes,
    in_flight_micro_batches,
    memory_per_rank,
    micro_batch_size,
    peak_memory,
)
from parallel.plan.model import unit_param_counts
from parallel.plan.validate_worker import measure_memory

SMALL = get_config("small")
GPT3 = get_config("gpt3-175b")


@pytest.mark.skipif(dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: this test did NOT run !!!")
def test_bf16_moments_take_the_optimizer_state_from_12_to_8_bytes_beside_float32_masters():
    p = 421376
    for policy, params, grads in (("bf16", 2, 6), ("float32", 4, 4), ("fp8-delayed", 4, 4)):
        wide, narrow = (param_bytes_per_rank(SMALL, 1, 1, 1, dtype=policy + suffix) for suffix in ("", "+bf16-moments"))
        assert wide["params"] == narrow["params"] == params * p and wide["grads"] == narrow["grads"] == grads * p
        assert (wide["optim"], narrow["optim"]) == ((12 if policy == "bf16" else 8) * p, (8 if policy == "bf16" else 4) * p)
    zero3 = param_bytes_per_rank(SMALL, 4, 1, 1, dtype="bf16+bf16-moments", zero=3)
    assert zero3["optim"] == sum(-(-n // 4) for n in unit_param_counts(SMALL, 1, 1, 0)) * 8  # masters + moments / 4
    with pytest.raises(ValueError, match="bfloat16 moments need a policy"):
        param_bytes_per_rank(SMALL, 1, 1, 1, dtype="mixed+bf16-moments")


def test_float32_float64_and_mixed_bytes_per_parameter():
    p = 421376
    assert param_bytes_per_rank(SMALL, 1, 1, 1) == {"params": 4 * p, "grads": 4 * p, "optim": 8 * p}
    assert param_bytes_per_rank(SMALL, 1, 1, 1, dtype="float64") == \
        {"params": 8 * p, "grads": 8 * p, "optim": 16 * p}
    mixed = param_bytes_per_rank(SMALL, 1, 1, 1, dtype="mixed")
    assert mixed == {"params": 2 * p, "grads": 2 * p, "optim": 12 * p}
    assert sum(mixed.values()) == 16 * p


@given(st.integers(1, 17))
def test_zero1_shards_adam_states_by_ceil_division(dp):
    plain = param_bytes_per_rank(SMALL, dp, 1, 1, (dp - 1, 0, 0))
    sharded = param_bytes_per_rank(SMALL, dp, 1, 1, (dp - 1, 0, 0), zero=True)
    shard = sharded["optim"] // 8
    assert shard == -(-421376 // dp)
    assert 421376 <= dp * shard < 421376 + dp
    assert sharded["params"] == plain["params"] and sharded["grads"] == plain["grads"]


def test_rank_coords_tuple_or_dict_and_range_checks():
    by_tuple = param_bytes_per_rank(TINY, 2, 2, 2, (1, 1, 1))
    assert by_tuple == param_bytes_per_rank(TINY, 2, 2, 2, {"dp": 1, "tp": 1, "pp": 1})
    # last stage, tp=2: one block of 460 parameters per rank, ln_f 2·8, half of lm_head 8·8
    assert by_tuple == {"params": 540 * 4, "grads": 540 * 4, "optim": 540 * 8}
    with pytest.raises(ValueError, match="pp_rank=2 out of range for pp=2"):
        param_bytes_per_rank(SMALL, 2, 2, 2, (0, 0, 2))
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        param_bytes_per_rank(SMALL, 1, 1, 1, dtype="float16")


def test_korthikanti_activation_formulas_for_gpt3():
    # s=2048, b=1, h=12288, a=96, t=8 at 2 bytes: sbh = 25,165,824; 5as/h = 80.
    sbh = 2048 * 12288
    assert block_activation_bytes(GPT3, 1, dtype="mixed") == sbh * (34 + 80)
    assert block_activation_bytes(GPT3, 1, tp=8, dtype="mixed") == sbh * (10 + 3 + 10)
    assert block_activation_bytes(GPT3, 1, tp=8, sequence_parallel=True, dtype="mixed") == \
        sbh * 114 / 8
    assert block_activation_bytes(GPT3, 1, tp=8, recompute=True, dtype="mixed") == 2 * sbh
    assert block_activation_bytes(GPT3, 1, tp=8, sequence_parallel=True, recompute=True,
                                  dtype="mixed") == 2 * sbh / 8
    # float32 doubles every figure, and b scales linearly
    assert block_activation_bytes(GPT3, 3, tp=8) == 2 * 3 * sbh * 23


def test_in_flight_micro_batches():
    assert [in_flight_micro_batches("1f1b", 8, 4, stage) for stage in range(4)] == [4, 3, 2, 1]
    assert [in_flight_micro_batches("1f1b", 2, 4, stage) for stage in range(4)] == [2, 2, 2, 1]
    assert [in_flight_micro_batches("gpipe", 8, 4, stage) for stage in range(4)] == [8] * 4


# Small enough to count by hand: V=16, s=4, 2 blocks, a=2 heads, h=8. One block on one tp=2
# rank holds 460 parameters: ln_1, ln_2 4·8; q, k, v 3·(64 + 8)/2; attn.proj 64/2 + 8;
# mlp.fc (256 + 32)/2; mlp.proj 256/2 + 8. Stage 0 adds half the token table (8·8) and the
# positions (4·8): 556; the last stage adds ln_f (2·8) and half of lm_head (8·8): 540.
TINY = GPTConfig(vocab_size=16, block_size=4, n_layer=2, n_head=2, d_model=8)
# Activations per block, b=2 sequences, tp=2, float32 (2× the 2-byte formula):
# s·b·h·(10 + 24/t + 5·a·s/(h·t))·2 = 64·(10 + 12 + 2.5)·2 = 3136 B.
BLOCK = 3136


@pytest.mark.parametrize("stage, in_flight", [(0, 2), (1, 1)])
def test_stage_activations_are_blocks_times_micro_batches_in_flight(stage, in_flight):
    layout = Layout(dp=2, tp=2, pp=2, micro_batches=2)
    assert activation_bytes_per_rank(TINY, layout, 2, stage) == BLOCK * in_flight   # 1F1B: min(m, p − stage)
    gpipe = Layout(dp=2, tp=2, pp=2, micro_batches=2, schedule="gpipe")
    assert activation_bytes_per_rank(TINY, gpipe, 2, stage) == BLOCK * 2            # GPipe: all m
    # recomputation keeps each block's input, 2·s·b·h·2 = 256 B, plus one block in full while recomputed
    recomputed = Layout(dp=2, tp=2, pp=2, micro_batches=2, recompute=True)
    assert activation_bytes_per_rank(TINY, recomputed, 2, stage) == 256 * in_flight + BLOCK
    # sequence parallel splits everything: s·b·h·(34 + 5·a·s/h)/t·2 = 64·39 = 2496 B
    sp = Layout(dp=2, tp=2, pp=2, micro_batches=2, sequence_parallel=True)
    assert activation_bytes_per_rank(TINY, sp, 2, stage) == 2496 * in_flight


def test_memory_per_rank_and_peak_stage():
    # dp=3 with ZeRO-1: ceil(556 / 3) = 186 and ceil(540 / 3) = 180 elements of AdamW state
    layout = Layout(dp=3, tp=2, pp=2, micro_batches=2, zero=True)
    first = {"params": 556 * 4, "grads": 556 * 4, "optim": 186 * 8, "activations": 2 * BLOCK}
    last = {"params": 540 * 4, "grads": 540 * 4, "optim": 180 * 8, "activations": 1 * BLOCK}
    assert memory_per_rank(TINY, layout, batch=12, rank_coords=(2, 1, 0)) == {**first, "total": 12208}
    assert memory_per_rank(TINY, layout, batch=12, rank_coords=(0, 0, 1)) == {**last, "total": 8896}
    assert peak_memory(TINY, layout, batch=12) == (0, {**first, "total": 12208})


def test_micro_batch_size_divisibility():
    assert micro_batch_size(32, Layout(dp=2, micro_batches=4)) == 4
    with pytest.raises(ValueError, match="batch=30.*dp=2.*micro_batches=4"):
        micro_batch_size(30, Layout(dp=2, micro_batches=4))


def test_layout_validation():
    with pytest.raises(ValueError, match="sequence_parallel needs tp > 1"):
        Layout(sequence_parallel=True)
    with pytest.raises(ValueError, match="Layout.dp must be a positive int, got 0"):
        Layout(dp=0)
    with pytest.raises(ValueError, match="schedule='zb'"):
        Layout(schedule="zb")


def test_in_flight_micro_batches_are_the_schedule_checkers_peaks():
    for schedule in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        for pp in range(1, 5):
            for m in range(1, 9):
                peaks = check_schedule(get_schedule(schedule, pp, m), pp, m).peak_activations
                assert [in_flight_micro_batches(schedule, m, pp, stage) for stage in range(pp)] == peaks


@pytest.mark.parametrize("precision, layout", [
    ("fp16", dict(dp=1, tp=1, pp=1, zero=False)), ("fp16", dict(dp=2, tp=1, pp=1, zero=True)),
    ("fp16", dict(dp=3, tp=1, pp=2, zero=3)), ("fp16", dict(dp=2, tp=2, pp=1, zero=2)),
    pytest.param("bf16", dict(dp=1, tp=2, pp=1, zero=False), marks=pytest.mark.skipif(
        dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: this bfloat16 test did NOT run !!!")),
])
def test_memory_under_a_precision_policy_equals_the_live_arrays(precision, layout):
    # 16-bit weight and gradient, fp32 master gradient, fp32 master and moments (moments sharded by ZeRO-1;
    # under ZeRO-2/3 the masters too, and the kept gradient is the float32 chunk)
    config = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=2, d_model=16)

    def measured():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config), Mesh(layout["dp"], layout["tp"], layout["pp"]), zero=layout["zero"],
                          precision=precision, scaler=dict(init_scale=2.0**8))
        model.configure_optimizer()
        idx = np.random.default_rng(0).integers(0, 12, (6, 8))
        for _ in range(2):
            model.train_step(idx, idx)
            model.finish_grad_sync()
            memory = measure_memory(model)
            model.optimizer_step()
        assert model.amp.skipped == 0  # the optimizer state exists
        return model.mesh.coords, memory

    world = layout["dp"] * layout["tp"] * layout["pp"]
    for coords, memory in run_threads(world, measured):
        assert memory == param_bytes_per_rank(config, layout["dp"], layout["tp"], layout["pp"], coords,
                                              dtype=precision, zero=layout["zero"])
    p = GPT(config).num_parameters()
    assert sum(param_bytes_per_rank(config, 1, 1, 1, dtype=precision).values()) == 20 * p  # 2 + 2 + 12, + 4


def test_a_mixed_policy_reduces_float32_gradients_and_counts_the_master_gradient():
    from parallel.plan.layout import get_precision
    fp16 = get_precision("fp16")
    assert (fp16.param_bytes, fp16.grad_bytes, fp16.optim_bytes, fp16.master_bytes) == (2, 2 + 4, 8, 4)
    assert fp16.dp_grad_bytes == 4 and get_precision("float32").dp_grad_bytes == 4  # the dp all-reduce moves float32
    assert get_precision("fp64") == get_precision("float64").__class__("fp64", 8, 8, 16, 8, ("float64",))


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_zero_3_under_a_16_bit_policy_holds_2_plus_4_plus_12_bytes_over_the_replicas(replicas):
    # per parameter of each unit's R equal chunks: a 16-bit chunk, its float32 gradient chunk,
    # the float32 master chunk and two float32 moments; ZeRO-2 keeps the 16-bit parameters whole
    config = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=2, d_model=16)
    chunks = sum(-(-unit // replicas) for unit in unit_param_counts(config, 1, 1, 0))
    stage3 = param_bytes_per_rank(config, replicas, 1, 1, dtype="fp16", zero=3)
    stage2 = param_bytes_per_rank(config, replicas, 1, 1, dtype="fp16", zero=2)
    assert stage3 == {"params": 2 * chunks, "grads": 4 * chunks, "optim": 12 * chunks}
    assert stage2 == dict(stage3, params=2 * GPT(config).num_parameters())


# --- issue 48: flash attention keeps no probabilities -------------------------------

@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (2, True)])
def test_flash_attention_drops_the_scores_term_and_grows_linearly_with_the_sequence(tp, sp):
    """Dense: the 5·a·s/h term (the T × T probabilities); flash: q, k, v, output only (the
    ring's 8), so a block's activations double, no more, when the sequence doubles."""
    short, long = (GPTConfig(vocab_size=64, block_size=s, n_layer=2, n_head=4, d_model=32) for s in (256, 512))
    b, (s, h, a) = 2, (256, 32, 4)
    flash = [block_activation_bytes(c, b, tp, sp, attention="flash") for c in (short, long)]
    dense = [block_activation_bytes(c, b, tp, sp) for c in (short, long)]
    assert flash[1] == 2 * flash[0] and dense[1] > 2 * dense[0]
    assert dense[0] - flash[0] == pytest.approx(s * b * h * (5 * a * s / h - 8) / tp * 2)  # float32: 4/2
    assert block_activation_bytes(short, b, tp, sp, cp=2, attention="flash") == block_activation_bytes(
        short, b, tp, sp, cp=2)  # under the ring the probabilities were never kept


def test_a_flash_layout_needs_less_activation_memory_and_says_so():
    flash, dense = Layout(tp=2, attention="flash"), Layout(tp=2)
    assert memory_per_rank(SMALL, flash, 8)["activations"] < memory_per_rank(SMALL, dense, 8)["activations"]
    assert flash.flags() == "flash" and dense.flags() == "-"
    with pytest.raises(ValueError, match=r"Layout.attention='sparse' must be one of \('dense', 'flash'\)"):
        Layout(attention="sparse")


def test_the_planner_fits_a_longer_sequence_with_flash_attention():
    """`python -m parallel.plan --longest-sequence --attention flash`: with no s² term the longest
    sequence that fits grows, and every layout the search returns carries the kernel."""
    from parallel.plan.search import longest_sequence
    dense, flash = (longest_sequence(get_config("small"), 2, 2, "laptop-cpu", 2**28, attention=kernel)
                    for kernel in ("dense", "flash"))
    assert flash[0] > 2 * dense[0] > 0
    assert flash[1].layout.attention == "flash" and dense[1].layout.attention == "dense"
