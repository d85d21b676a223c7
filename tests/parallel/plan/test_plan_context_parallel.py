"""The planner and context parallelism: what divides by cp and what does not, the ring's
exposed time, cp layouts in the search, and the longest sequence that fits."""
import re
from dataclasses import replace

import pytest

from minitensor.models.gpt import GPTConfig
from parallel.plan import (
    Layout,
    block_activation_bytes,
    estimate,
    get_config,
    load_profile,
    longest_sequence,
    param_bytes_per_rank,
    plan,
)
from parallel.plan.cost import ring_time

LAPTOP = load_profile("laptop-cpu")
MEDIUM = get_config("medium")


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_activations_per_rank_divide_by_cp_and_lose_the_attention_probabilities(cp):
    config = replace(MEDIUM, block_size=1024)
    s, b, h = config.block_size, 2, config.d_model
    # recomputation keeps only each block's input: exactly 1/cp of it
    assert block_activation_bytes(config, b, recompute=True, cp=cp) * cp == block_activation_bytes(
        config, b, recompute=True)
    # otherwise the per-token terms divide by cp; the 5·a·s/h probabilities become q, k, v, output (8)
    for tp, sp in ((1, False), (2, False), (2, True)):
        expected = s // cp * b * h * ((34 + 8) / tp if sp else 10 + 24 / tp + 8 / tp) * 4 / 2
        assert block_activation_bytes(config, b, tp, sp, cp=cp) == pytest.approx(expected)
        assert block_activation_bytes(config, b, tp, sp, cp=cp) < block_activation_bytes(config, b, tp, sp) / cp


def test_parameters_do_not_divide_by_cp_and_zero_shards_the_states_over_dp_times_cp():
    plain = param_bytes_per_rank(MEDIUM, 2, 1, 1, zero=True)
    with_cp = param_bytes_per_rank(MEDIUM, 2, 1, 1, zero=True, cp=4)
    assert with_cp["params"] == plain["params"] and with_cp["grads"] == plain["grads"]
    count = plain["params"] // 4
    assert with_cp["optim"] == -(-count // 8) * 8


def test_the_ring_is_charged_only_beyond_the_attention_compute_it_overlaps():
    config = GPTConfig(vocab_size=16, block_size=64, n_layer=1, n_head=2, d_model=8)
    layout = Layout(cp=4)
    b, alpha, beta, rate = 2, 1e-3, 1e-9, 1e12
    block = b * 16 * 8  # b·s/cp·h
    sends = 6 * 4 - 4
    ring = sends * alpha + sends * block * 4 * beta
    attention = 3 * 4 * 64 * 8 * (b * 16) / rate
    assert ring_time(config, layout, b, rate, alpha, beta, 4) == pytest.approx(ring - attention)
    assert ring_time(config, layout, b, 1e3, alpha, beta, 4) == 0.0  # slow compute hides the ring


def test_estimate_with_cp_splits_the_tokens_and_reports_the_ring():
    config = replace(MEDIUM, block_size=1024)
    plain, split = (estimate(config, Layout(tp=2, cp=cp), 8, LAPTOP) for cp in (1, 2))
    assert "cp" in split.comm and "cp" not in plain.comm
    assert split.memory["activations"] < plain.memory["activations"] / 2
    assert split.memory["params"] == plain.memory["params"]
    # attention sees all s keys from s/cp queries; the matmuls see s/cp tokens: compute halves
    assert split.time["compute"] == pytest.approx(plain.time["compute"] / 2)
    assert any("cp ring" in line for line in split.lines)


def test_the_search_tries_cp_only_when_asked_and_only_where_the_sequence_divides():
    config = replace(MEDIUM, block_size=12)  # 2·cp divides 12 for cp 1, 2 (not 4)
    without = plan(config, 4, 8, LAPTOP)
    assert all(est.layout.cp == 1 for est in without.ranked)
    with_cp = plan(config, 4, 8, LAPTOP, max_cp=4)
    assert {est.layout.cp for est in with_cp.ranked} == {1, 2}
    assert with_cp.rejected["grids with seq=12 not divisible by 2·cp"] > 0


def test_the_longest_sequence_that_fits_grows_with_cp():
    memory = 2 * 2**30
    seq, best = longest_sequence(MEDIUM, 8, 8, LAPTOP, memory)
    seq_cp, best_cp = longest_sequence(MEDIUM, 8, 8, LAPTOP, memory, max_cp=8)
    assert best.memory["total"] <= memory and best_cp.memory["total"] <= memory
    assert seq_cp > 4 * seq and best_cp.layout.cp > 1 and seq_cp % 16 == 0
    beyond = replace(MEDIUM, block_size=seq_cp + 16)  # one step longer fits no layout
    assert not plan(beyond, 8, 8, LAPTOP, memory, max_cp=8).ranked
    assert longest_sequence(MEDIUM, 1, 8, LAPTOP, 1000) == (0, None)


def test_the_cli_answers_the_longest_sequence_question(capsys):
    from parallel.plan.__main__ import main
    assert main(["--config", "medium", "--devices", "8", "--mem-per-device", "2GiB", "--batch", "8",
                 "--max-cp", "8", "--longest-sequence"]) == 0
    out = capsys.readouterr().out
    without, with_cp = (int(n) for n in re.findall(r"^  cp ≤ \d+: (\d+) tokens", out, re.M))
    assert with_cp > without and "·cp" in out.splitlines()[-1]
