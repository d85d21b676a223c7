"""Per-rank memory: parameter/gradient/optimizer bytes and Korthikanti activations."""
import pytest
from hypothesis import given, strategies as st

from parallel.pipeline import check_schedule, get_schedule
from parallel.plan import Layout, get_config, param_bytes_per_rank, param_count
from parallel.plan.memory import (activation_bytes_per_rank, block_activation_bytes,
                                  in_flight_micro_batches, memory_per_rank, micro_batch_size,
                                  peak_memory)

SMALL = get_config("small")
GPT3 = get_config("gpt3-175b")


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
    by_tuple = param_bytes_per_rank(SMALL, 2, 2, 2, (1, 1, 1))
    assert by_tuple == param_bytes_per_rank(SMALL, 2, 2, 2, {"dp": 1, "tp": 1, "pp": 1})
    assert by_tuple["params"] == 4 * param_count(SMALL, tp=2, pp=2, stage=1)
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
    assert block_activation_bytes(GPT3, 1, tp=8, checkpoint=True, dtype="mixed") == 2 * sbh
    assert block_activation_bytes(GPT3, 1, tp=8, sequence_parallel=True, checkpoint=True,
                                  dtype="mixed") == 2 * sbh / 8
    # float32 doubles every figure, and b scales linearly
    assert block_activation_bytes(GPT3, 3, tp=8) == 2 * 3 * sbh * 23


def test_in_flight_micro_batches():
    assert [in_flight_micro_batches("1f1b", 8, 4, stage) for stage in range(4)] == [4, 3, 2, 1]
    assert [in_flight_micro_batches("1f1b", 2, 4, stage) for stage in range(4)] == [2, 2, 2, 1]
    assert [in_flight_micro_batches("gpipe", 8, 4, stage) for stage in range(4)] == [8] * 4


def test_stage_activations_multiply_layers_and_in_flight():
    layout = Layout(dp=1, tp=1, pp=2, micro_batches=4)
    per_block = block_activation_bytes(SMALL, 2)
    assert activation_bytes_per_rank(SMALL, layout, 2, stage=0) == 1 * per_block * 2
    assert activation_bytes_per_rank(SMALL, layout, 2, stage=1) == 1 * per_block * 1
    checkpointed = Layout(pp=2, micro_batches=4, checkpoint=True)
    # the kept block inputs plus one block recomputed in full during backward
    assert activation_bytes_per_rank(SMALL, checkpointed, 2, stage=0) == \
        2 * block_activation_bytes(SMALL, 2, checkpoint=True) + per_block


def test_memory_per_rank_and_peak_stage():
    layout = Layout(dp=2, tp=1, pp=2, micro_batches=4, zero=True)
    memory = memory_per_rank(SMALL, layout, batch=16, rank_coords=(1, 0, 0))
    assert memory["total"] == memory["params"] + memory["grads"] + memory["optim"] + \
        memory["activations"]
    stage, peak = peak_memory(SMALL, layout, batch=16)
    assert stage == 0 and peak == memory_per_rank(SMALL, layout, 16, (0, 0, 0))
    assert peak["total"] >= memory_per_rank(SMALL, layout, 16, (0, 0, 1))["total"]


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
