"""The planner's memory figures against real models, and the rank statistics of its validation.

`param_bytes_per_rank` claims exact counts (parallel/plan/model.py), so the measured bytes of
every rank of real HybridGPTs must equal it, not just fall within the 10% the planner promises:
parameters, gradients after a synced backward, and AdamW / ZeRO state after a step (ZeRO-2/3:
the shards, measured from the live arrays, with every unit padded to dp equal chunks).
"""
import dataclasses
import json

import numpy as np
import pytest
from mpi_launch import REPO

import minitensor as mt
import parallel
from minitensor.models import gpt as dense
from parallel import HybridGPT, Mesh, run_threads
from parallel.pipeline.partition import balance_by_parameters
from parallel.plan import GPTConfig, Layout, estimate, get_config, load_profile, param_bytes_per_rank
from parallel.plan.model import block_param_count
from parallel.plan.parts import local_config
from parallel.plan.rank_stats import kendall, ranks, separated, spearman
from parallel.plan.simulate import PartCosts
from parallel.plan.validate import (
    main as validate_main,
)
from parallel.plan.validate import (
    memory_errors,
    merge,
    merge_links,
    merge_parts,
    merge_sweeps,
    noise,
    report_time,
    with_link,
)
from parallel.plan.validate_worker import (
    KINDS,
    LAYOUTS,
    measure_alone_speedup,
    measure_collectives,
    measure_link,
    measure_memory,
    measure_parts_on_every_rank,
    run_layout,
    runnable,
    unpack,
)
from parallel.tensor_parallel.sharding import padded_size

# vocab 13 is padded under tp 2 and 4; 4 blocks allow pp 4.
CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=4, n_head=4, d_model=16)


def measured_and_predicted(layout, sequence_parallel=False):
    """[(measured, predicted)] bytes dicts of every rank, float64, after two optimizer steps."""
    dp, tp, pp, zero = layout

    def body():
        mt.manual_seed(0)
        gpt = dense.GPT(dense.GPTConfig(**dataclasses.asdict(CONFIG)), dtype=np.float64)
        balance = balance_by_parameters(gpt, pp)
        mesh = Mesh(dp, tp, pp)
        model = HybridGPT(gpt, mesh, microbatches=2, zero=zero, sequence_parallel=sequence_parallel,
                          balance=balance)
        model.configure_optimizer()
        idx = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (8, CONFIG.block_size))
        model.train_step(idx, idx)
        model.optimizer_step()
        model.train_step(idx, idx)
        model.finish_grad_sync()
        predicted = param_bytes_per_rank(CONFIG, dp, tp, pp, mesh.coords, "float64", zero, balance)
        return measure_memory(model), predicted
    return run_threads(dp * tp * pp, body)


@pytest.mark.parametrize("layout, sequence_parallel", [
    ((2, 2, 2, True), False), ((1, 4, 1, False), True), ((1, 1, 4, False), False), ((2, 1, 2, False), False),
    ((4, 1, 1, True), False), ((2, 2, 2, 2), True), ((2, 1, 2, 3), False), ((4, 2, 1, 3), False),
], ids=["dp2-tp2-pp2-zero", "tp4-sp", "pp4", "dp2-pp2", "dp4-zero", "dp2-tp2-pp2-zero2-sp", "dp2-pp2-zero3",
        "dp4-tp2-zero3"])
def test_measured_bytes_of_every_rank_equal_the_planner(layout, sequence_parallel):
    for rank, (measured, predicted) in enumerate(measured_and_predicted(layout, sequence_parallel)):
        assert measured == predicted, f"rank {rank} of {layout}"


def test_the_validation_worker_measures_a_layout_and_its_memory_matches():
    config = GPTConfig(vocab_size=10, block_size=4, n_layer=2, n_head=2, d_model=8)
    layout = (2, 2, 1, False)
    times, memory = run_threads(4, lambda: run_layout(parallel.world(), config, layout, 4, 2, 2))[0]
    assert len(times) == 2 and min(times) > 0 and len(memory) == 4  # 2 timed steps after the warm-up
    rows = memory_errors(config, [{"layout": layout, "memory": memory}])
    assert len(rows) == 4 * len(KINDS) and all(error == 0 for *_, error in rows)


def test_runnable_layouts_respect_heads_blocks_and_batch():
    small = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, d_model=128)
    assert (1, 1, 4, False) not in runnable(small, 16, 2)             # 2 blocks, 4 stages
    assert (4, 1, 1, False) not in runnable(small, 4, 2)              # 4 rows over dp 4 × m 2
    three_heads = GPTConfig(vocab_size=64, block_size=64, n_layer=4, n_head=6, d_model=96)
    assert all(tp in (1, 2) for _, tp, _, _, _ in runnable(three_heads, 16, 2))


def test_rank_statistics():
    assert ranks([0.3, 0.1, 0.2, 0.1]) == [4, 1.5, 3, 1.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert kendall([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)   # 2 concordant, 1 discordant pair
    assert kendall([1, 2, 3, 4], [4, 3, 2, 1]) == -1
    # Spearman's rho is 1 − 6 Σ d² / (n (n² − 1)) without ties.
    a, b = [5, 1, 4, 2, 3], [2, 1, 5, 3, 4]
    d2 = sum((x - y) ** 2 for x, y in zip(ranks(a), ranks(b)))
    assert spearman(a, b) == pytest.approx(1 - 6 * d2 / (5 * 24))


def test_two_rank_layouts_and_an_unknown_rank_count():
    small = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, d_model=128)
    assert runnable(small, 16, 2, ranks=2) == [layout for layout in LAYOUTS[2] if unpack(layout)[5] != "dualpipev"]
    assert (1, 1, 2, 0, False, "dualpipev") in runnable(get_config("medium"), 8, 4, ranks=2)  # 4 stages, m ≥ 2·pp
    with pytest.raises(ValueError, match="not 3"):
        runnable(small, 16, 2, ranks=3)


def test_merge_parts_takes_each_figures_median_over_the_sweeps():
    costs = [dict(embed=[e, 2 * e], block=[3.0, 4.0], head=[5.0, 6.0], optimizer_per_param=e) for e in (1.0, 9.0, 2.0)]
    merged = merge_parts([{"parts": [2, 1], "costs": c} for c in costs])
    assert merged == {(2, 1): PartCosts((2.0, 4.0), (3.0, 4.0), (5.0, 6.0), 2.0)}


def test_parts_are_measured_on_every_rank_and_averaged():
    config = GPTConfig(vocab_size=10, block_size=4, n_layer=2, n_head=2, d_model=8)
    got = run_threads(2, lambda: measure_parts_on_every_rank(parallel.world(), config, 2, 2))
    assert got[0] == got[1]
    assert all(t > 0 for t in (*got[0].embed, *got[0].block, *got[0].head, got[0].optimizer_per_param))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_tp_ranks_local_block_holds_the_parameters_the_planner_counts(tp):
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=4, d_model=16)
    local = dense.GPT(local_config(config, tp), dtype=np.float64)
    assert local.blocks[0].num_parameters() == block_param_count(config.d_model, tp)
    assert local.config.vocab_size == padded_size(config.vocab_size, tp) // tp


@pytest.mark.parametrize("size", [2, 4])
def test_the_link_is_measured_between_ranks_0_and_1_while_the_others_wait(size):
    got = run_threads(size, lambda: measure_link(parallel.world()))
    assert all(figures["alpha_us"] > 0 and figures["bandwidth_gbps"] > 0 for figures in got[:2])
    assert got[2:] == [None] * (size - 2)


def test_only_layouts_further_apart_than_the_noise_are_chained():
    assert separated([1.0, 1.05, 1.3, 1.2, 2.0], 0.1) == [0, 3, 4]   # 1.05 and 1.3 are within 10% of the last kept


def test_the_alone_speed_up_is_measured_on_rank_0():
    config = GPTConfig(vocab_size=10, block_size=4, n_layer=2, n_head=2, d_model=8)
    got = run_threads(2, lambda: measure_alone_speedup(parallel.world(), config))
    assert got[0] > 0 and got[1] is None


def test_a_saved_measurement_is_reported_again_without_running(tmp_path, capsys):
    """--load: the report of hand-made measurements (two 2-rank layouts of the small config);
    the simulation of dp2 is its parts' forward + backward of 2 blocks and the ends, then
    the dp all-reduce and the optimizer, on the measured link."""
    parts = {"embed": [0.0, 0.0], "block": [0.1, 0.2], "head": [0.0, 0.0], "optimizer_per_param": 0.0}
    lines = [{"link": {"alpha_us": 10.0, "bandwidth_gbps": 1.0}},
             {"parts": [8, 1], "costs": parts}, {"parts": [16, 2], "costs": parts}]
    memory = [{"params": 1, "grads": 1, "optim": 1}] * 2
    lines += [{"layout": layout, "microbatches": 1, "seconds": seconds, "memory": memory}
              for layout, seconds in (([2, 1, 1, 0], 0.7), ([1, 2, 1, 0], 0.9))]
    path = tmp_path / "measured.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    results, merged, link = merge(path.read_text().splitlines())
    assert link == {"alpha_us": 10.0, "bandwidth_gbps": 1.0, "alone_speedup": 1.0, "collectives": {}}
    assert set(merged) == {(8, 1), (16, 2)}
    profile = load_profile("laptop-cpu")
    predicted, measured = report_time(get_config("small"), 16, profile, results, merged, link)
    dp = estimate(get_config("small"), Layout(dp=2), 16, with_link(profile, link)).comm["dp"]
    assert predicted["simulated"][0] == pytest.approx(2 * 0.3 + dp) and measured == [0.7, 0.9]
    assert "simulated: Spearman rho = +1.000" in capsys.readouterr().out


def test_collectives_are_fitted_on_every_group_size_all_groups_at_once():
    got = run_threads(4, lambda: measure_collectives(parallel.world(), [2, 4], large=2**16))
    assert got[0] == got[3]            # the slowest rank's median: one figure on every rank
    assert set(got[0]) == {2, 4}
    assert all(f["alpha_us"] > 0 and f["bandwidth_gbps"] > 0 for f in got[0].values())


def test_the_fitted_collectives_are_merged_per_group_size_figure_by_figure():
    lines = [{"link": {"alpha_us": a, "bandwidth_gbps": 1.0, "collectives": {"2": {"alpha_us": a, "bandwidth_gbps": g}}}}
             for a, g in ((1.0, 5.0), (3.0, 4.0), (2.0, 9.0))]
    assert merge_links(lines)["collectives"] == {2: {"alpha_us": 2.0, "bandwidth_gbps": 5.0}}


def test_layouts_saved_before_recomputation_was_measured_read_as_without_it():
    assert unpack([2, 1, 1, 3]) == (2, 1, 1, 3, False, "1f1b")
    assert unpack((1, 1, 2, 0, True)) == (1, 1, 2, 0, True, "1f1b")
    assert unpack([1, 1, 2, 0, False, "dualpipev"]) == (1, 1, 2, 0, False, "dualpipev")


def test_a_sweeps_time_is_the_median_or_the_fastest_of_its_steps():
    """Two sweeps of one layout: the medians 0.5 and 0.7 give 0.6 within a 33% range; the
    fastest steps 0.4 and 0.45 give 0.425. A file without the steps (saved before they were
    recorded) cannot give the fastest, and says so."""
    memory = [{"params": 1, "grads": 1, "optim": 1}]
    sweeps = [{"layout": [1, 1, 1, 0], "microbatches": 1, "seconds": 0.5, "steps": [0.6, 0.4, 0.5], "memory": memory},
              {"layout": [1, 1, 1, 0], "microbatches": 1, "seconds": 0.7, "steps": [0.45, 0.7, 0.9], "memory": memory}]
    (median,) = merge_sweeps(sweeps)
    assert median["seconds"] == pytest.approx(0.6) and median["spread"] == (0.5, 0.7)
    assert noise([median]) == pytest.approx(0.2 / 0.6)
    (fastest,) = merge_sweeps(sweeps, "fastest")
    assert fastest["seconds"] == pytest.approx(0.425) and fastest["spread"] == (0.4, 0.45)
    with pytest.raises(SystemExit, match="--statistic fastest needs each step's time"):
        merge_sweeps([{key: value for key, value in sweeps[0].items() if key != "steps"}], "fastest")


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_chapters_measurements_are_reported_again_with_either_statistic(ranks, capsys):
    """Chapter 10 prints its tables from the committed files (`--load`): every one of the 24
    layouts has 3 sweeps with their timed steps, and both statistics give a full report."""
    path = str(REPO / f"tutorials/10_planner/measured/validate_{ranks}_ranks.jsonl")
    for statistic in ("median", "fastest"):
        assert validate_main(["--load", path, "--ranks", str(ranks), "--statistic", statistic]) == 0
        out = capsys.readouterr().out
        assert f"3 sweeps of 6 timed steps, a sweep's time of a layout the {statistic} of its steps" in out
        assert "simulated: Spearman rho" in out
        assert sum(line.startswith("dp") for line in out.splitlines()) == 24
