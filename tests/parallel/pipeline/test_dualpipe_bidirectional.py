"""DualPipe, the bidirectional schedule: its order by hand, checked deadlock-free and complete in both
directions, the two copies of every stage summed and kept equal, and --check on threads and real ranks."""
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_launch import requires_mpiexec, run_mpi
from test_dualpipe import computes

import parallel
from parallel import HybridGPT, Mesh
from parallel.bench.dualpipe import formula, simulated_idle
from parallel.bench.dualpipe import main as bench_main
from parallel.pipeline import (
    Action,
    ScheduleError,
    Timeline,
    bubble_theory,
    check_schedule,
    get_schedule,
    placement_of,
    rank_and_chunk,
    stage_of,
)
from parallel.pipeline.dualpipe import dualpipe, dualpipe_order
from parallel.pipeline.placement import microbatches_of
from parallel.train import main

# p = 4, m = 8 (2 each way per half-rank), from DeepSeek's DualPipe.step: half_rank 0, half_num_chunks 4.
# Rank 0's phase 0 is the down direction (chunk a, micro-batches 0-3), phase 1 the up one (chunk b, 4-7).
HAND_RANK_0 = ("F0a F1a "                 # 1: 2(p/2-1-h) = 2 x F0
               "F2a F4b "                 # 2: h+1 = 1 x F0 F1
               "Bi4b W4b F5b "            # 3: p/2-1-h = 1 x B1(zb) W F1
               "F3a B5b F6b B0a "         # 4: m/2-p+h+1 = 1 x F0&B1 F1&B0
               "B6b F7b B1a "             # 5: 1 x B1 F1&B0
               "B7b Bi2a "                # 6: 1 x B1 B0, zb from the middle on (h even: after B1)
               "W2a Bi3a "                # 7: 1 x W B0(zb)
               "W3a")                     # 8: 1 x W
# Rank 3 sees the same phases from the other end: its phase 0 is the up direction (chunk b).
HAND_RANK_3 = "F4b F5b F6b F0a Bi0a W0a F1a F7b B1a F2a B4b B2a F3a B5b B3a Bi6b W6b Bi7b W7b"


def test_dualpipe_order_for_4_ranks_and_8_micro_batches_equals_the_hand_derivation():
    assert computes(dualpipe_order(4, 8, 0)) == HAND_RANK_0
    assert computes(dualpipe_order(4, 8, 3)) == HAND_RANK_3


def test_rank_r_holds_stage_r_down_and_the_copy_of_stage_p_minus_1_minus_r_up():
    assert [[stage_of(r, c, 4, "mirror") for c in (0, 1)] for r in range(4)] == [[0, 3], [1, 2], [2, 1], [3, 0]]
    assert all(rank_and_chunk(stage_of(r, c, 4, "mirror"), 4, "mirror", c) == (r, c) for r in range(4) for c in (0, 1))
    assert list(microbatches_of(0, 8, "mirror")) == [0, 1, 2, 3] and list(microbatches_of(1, 8, "mirror")) == [4, 5, 6, 7]


@given(p=st.sampled_from([2, 4, 6]), extra=st.integers(0, 4))
def test_every_micro_batch_runs_every_stage_once_in_its_direction_without_deadlock(p, extra):
    m = 2 * p + 2 * extra
    schedule = get_schedule("dualpipe", p, m, 2)
    report = check_schedule(schedule, p, m, 2, placement="mirror")  # rendezvous; raises on deadlock or missing work
    assert report.peak_activations == [p + 1] * p  # table 2's PP+1
    for rank, actions in enumerate(schedule):
        for chunk in (0, 1):
            mine = list(microbatches_of(chunk, m, "mirror"))
            runs = {kind: [a.microbatch for a in actions if a.chunk == chunk and a.kind in kinds]
                    for kind, kinds in (("F", ("forward",)), ("B", ("backward", "backward_input")),
                                        ("W", ("backward", "backward_weight")))}
            assert runs == {"F": mine, "B": mine, "W": mine}  # once each, weight gradients in micro-batch order
        # the first half of the micro-batches goes down the ranks, the second half up
        assert all(a.peer == rank + (1 if (a.kind in ("send_fwd", "recv_bwd")) == (a.chunk == 0) else -1)
                   for a in actions if not a.is_compute)


def test_the_checker_refuses_a_micro_batch_in_the_wrong_direction_and_a_swapped_pair():
    schedule = dualpipe(2, 4)
    with pytest.raises(ScheduleError, match=r"chunk 0 runs micro-batches \[0, 1\] only"):
        check_schedule([[Action("forward", 2, 0)] + schedule[0], schedule[1]], 2, 4, 2, placement="mirror")
    with pytest.raises(ScheduleError):  # rank 0 receiving before it sent: a wait-for cycle or a missing input
        rank0 = list(schedule[0])
        first_send = next(i for i, a in enumerate(rank0) if a.kind == "send_fwd")
        rank0.insert(0, rank0.pop(first_send + 1))
        check_schedule([rank0, schedule[1]], 2, 4, 2, placement="mirror")


@pytest.mark.parametrize("p, m, message", [
    (3, 6, "dualpipe needs an even number of ranks (rank i pairs with rank p-1-i), got p=3"),
    (4, 6, "dualpipe needs an even number m ≥ 2·p = 8 of micro-batches (m/2 each way) for p=4 ranks, got m=6"),
    (2, 5, "got m=5")])
def test_bad_sizes_are_refused(p, m, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dualpipe(p, m)


def test_both_copies_of_every_stage_stay_equal_after_optimizer_steps():
    from parallel.pipeline.tied import MirroredGradients

    def train():
        import minitensor as mt
        from minitensor.models import GPT, GPTConfig

        mt.manual_seed(1)
        gpt = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=2, n_head=2, d_model=8)).double()
        model = HybridGPT(gpt, Mesh(1, 1, 2), microbatches=4, schedule="dualpipe", chunks=2)
        assert isinstance(model.tied, MirroredGradients)
        model.configure_optimizer(lr=1e-2)
        rng = np.random.default_rng(0)
        for _ in range(3):
            idx = rng.integers(0, 11, (8, 4))
            model.train_step(idx, idx)
            model.optimizer_step()
        return {stage.stage: {n: p.data.copy() for n, p in stage.named_parameters()} for stage in model.stages}

    rank0, rank1 = parallel.run_threads(2, train, timeout=60)
    for stage in (0, 1):  # rank 0's copy of stage s (chunk s) and rank 1's (chunk 1-s): one parameter
        assert rank0[stage].keys() == rank1[stage].keys()
        for name in rank0[stage]:
            np.testing.assert_array_equal(rank0[stage][name], rank1[stage][name])


@pytest.mark.parametrize("forward, backward, weight", [(1, 2, 1), (2, 3, 1), (1, 1.25, 0.25)])
@pytest.mark.parametrize("pp, m", [(4, 8), (6, 14), (8, 20), (8, 32)])
def test_table_2_bubble_holds_once_the_steady_state_is_reached(pp, m, forward, backward, weight):
    # where B's input part equals F and W fits its gaps (B - W = F >= W), and m >= 3·PP - 4 (PP >= 6)
    assert simulated_idle("dualpipe", pp, m, forward, backward, weight) == pytest.approx(
        formula("dualpipe", pp, forward, backward, weight), abs=1e-12)


@given(p=st.sampled_from([2, 4, 6, 8]), extra=st.integers(0, 3))
def test_the_bubble_theory_of_both_is_table_2s_from_the_steady_state_on(p, extra):
    for name, ranks, m in (("dualpipe", p, max(2 * p, 3 * p - 4) + 2 * extra),  # F = B - W = W = 1
                           ("dualpipev", p // 2, max(p, 3 * p // 2 - 2) + extra)):
        report = check_schedule(get_schedule(name, ranks, m, 2), ranks, m, 2, weight_time=1.0,
                                placement=placement_of(name))
        assert Timeline(report.events, ranks).bubble_fraction() == pytest.approx(bubble_theory(ranks, m, 2, name))


def test_with_few_micro_batches_the_short_steady_state_idles_less_than_table_2():
    assert simulated_idle("dualpipe", 8, 16, 1, 2, 1) == 5 < formula("dualpipe", 8, 1, 2, 1) == 6


def test_the_table_prints_dualpipe_with_2x_parameters_and_pp_plus_1_activations(capsys):
    assert bench_main(["--stages", "4", "--microbatches", "8", "--costs", "1,2,1"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["DualPipe"][1] == "4" and rows["DualPipe"][2:5] == ["2", "/", "2"]  # PP devices, idle = formula
    assert rows["DualPipe"][-2] == "5" and rows["1F1B"][-2] == "4"  # PP+1 and PP stage-graphs
    assert 1.9 < float(rows["DualPipe"][-3].rstrip("x")) <= 2.0  # stage i and the copy of stage PP-1-i
    assert bench_main(["--stages", "4", "--microbatches", "9"]) == 2  # odd: m/2 each way


def test_a_bare_pipeline_under_dualpipe_is_a_clear_error():
    # Pipeline alone has no pairs of ranks to sum the copies over: HybridGPT has (tied.MirroredGradients).
    from minitensor.models import GPT, GPTConfig

    def build():
        gpt = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=2, n_head=2, d_model=8))
        parallel.Pipeline.from_gpt(gpt, parallel.world(), microbatches=4, schedule="dualpipe", chunks=2)

    with pytest.raises(ValueError, match=r"GPT holds every stage twice under 'dualpipe', whose gradients must be "
                                         r"summed after backward: use HybridGPT\(model, Mesh\(1, 1, 2\)\)"):
        parallel.run_threads(2, build, timeout=30)


TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "4", "--batch", "8", "--digits", "2", "--steps", "2",
        "--dtype", "float64", "--schedule", "dualpipe", "--chunks", "2", "--microbatches", "4"]


@pytest.mark.parametrize("threads, layout", [(2, ["--pp", "2"]), (4, ["--pp", "2", "--dp", "2"]),
                                             (4, ["--pp", "2", "--tp", "2", "--zero", "3"]),
                                             (4, ["--pp", "4", "--microbatches", "8", "--batch", "16"]),
                                             (4, ["--pp", "2", "--cp", "2"]),
                                             (4, ["--pp", "2", "--dp", "2", "--experts", "4", "--ep", "2"])])
def test_check_passes_on_threads_composed_with_every_axis(threads, layout, capsys):
    result = main(TINY + ["--threads", str(threads), *layout, "--check"])
    assert result["check"] <= 1e-9


@pytest.mark.parametrize("extra, message", [
    (["--chunks", "1"], "--schedule dualpipe holds two stages per pp rank (r and the mirrored copy of pp-1-r): "
                        "give --chunks 2, got --chunks 1"),
    (["--pp", "3", "--threads", "3", "--microbatches", "6", "--batch", "12"],
     "--schedule dualpipe pairs pp rank r with pp-1-r: give an even --pp, got --pp 3"),
    (["--microbatches", "2"], "--schedule dualpipe needs even (m/2 each way) --microbatches ≥ 2·pp = 4, got 2"),
    (["--microbatches", "5", "--batch", "10"], "--schedule dualpipe needs even (m/2 each way) --microbatches"),
    (["--model", "bert"], "--schedule dualpipe with --model bert"),
])
def test_bad_dualpipe_flags_get_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--threads", "2", "--pp", "2", *extra])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error and len(error.strip().splitlines()) == 1


@requires_mpiexec
@pytest.mark.parametrize("layout", [pytest.param(["--pp", "4", "--microbatches", "8", "--batch", "16"],
                                                 marks=pytest.mark.deep),
                                    ["--pp", "2", "--dp", "2"]])
def test_check_passes_on_real_ranks(layout):
    result = run_mpi(4, ["-m", "parallel.train", *TINY, *layout, "--check"], timeout=180)
    difference = float(re.search(r"^check: largest relative difference .*: (\S+) ", result.stdout, re.M).group(1))
    assert difference <= 1e-9
