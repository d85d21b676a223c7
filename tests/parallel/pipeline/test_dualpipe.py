"""DualPipeV: its order by hand, checked deadlock-free, the V's placement, and --check on real ranks."""
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_launch import requires_mpiexec, run_mpi

from parallel.bench.dualpipe import formula, simulated_idle
from parallel.bench.dualpipe import main as bench_main
from parallel.pipeline import ScheduleError, Timeline, check_schedule, get_schedule, rank_and_chunk, stage_of
from parallel.pipeline.dualpipe import dualpipev, dualpipev_order
from parallel.train import main

LETTERS = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


def computes(actions):
    """F3b = forward of micro-batch 3 on chunk 1; a split backward's B is written Bi."""
    return " ".join(f"{LETTERS[a.kind]}{'i' if a.kind == 'backward_input' else ''}{a.microbatch}{'ab'[a.chunk]}"
                    for a in actions if a.is_compute)


# p = 4, m = 10, derived by hand from DeepSeek's eight phases (dualpipe.py's docstring), rank 0 and rank 3:
HAND_RANK_0 = ("F0a F1a F2a F3a F4a F5a "           # 1: 2(p-1-r) = 6 forwards of chunk 0
               "F6a F0b "                           # 2: r+1 = 1 x F0 F1
               "Bi0b W0b F1b Bi1b W1b F2b Bi2b W2b F3b "  # 3: p-1-r = 3 x B1(zb) W F1
               "F7a B3b F4b B0a F8a B4b F5b B1a F9a B5b F6b B2a "  # 4: m-2p+r+1 = 3 x F0&B1 F1&B0
               "B6b F7b B3a B7b F8b B4a B8b F9b B5a "  # 5: 3 x B1 F1&B0
               "B9b Bi6a "                          # 6: r+1 = 1 x B1 B0, zb from the middle (i = 0) after B1
               "W6a Bi7a W7a Bi8a W8a Bi9a "        # 7: 3 x W B0(zb)
               "W9a")                               # 8: r+1 = 1 W
HAND_RANK_3 = ("F0a F0b F1a F1b F2a F2b F3a F3b "   # 2: 4 x F0 F1 (phases 1, 3, 5, 7 are empty on the last rank)
               "F4a B0b F4b B0a F5a B1b F5b B1a F6a B2b F6b B2a F7a B3b F7b B3a F8a B4b F8b B4a F9a B5b F9b B5a "
               "B6b B6a B7b B7a Bi8b Bi8a Bi9b Bi9a "  # 6: odd rank: zb from i = 2 on, before B1
               "W8b W8a W9b W9a")                   # 8


def test_dualpipev_order_for_4_ranks_and_10_micro_batches_equals_the_hand_derivation():
    assert computes(dualpipev_order(4, 10, 0)) == HAND_RANK_0
    assert computes(dualpipev_order(4, 10, 3)) == HAND_RANK_3


def test_dualpipev_order_equals_torch_schedule_dual_pipe_v():
    pipelining = pytest.importorskip("torch.distributed.pipelining",
                                     reason="torch is not installed: the hand-derived order above is the reference")
    # torch lists each rank's actions as _Action(stage_index, computation_type, microbatch_index); its
    # OVERLAP_F_B pairs are run F first here, so compare the computes after expanding each pair.
    schedule = pipelining.schedules.ScheduleDualPipeV
    order = schedule._calculate_single_rank_operations if hasattr(schedule, "_calculate_single_rank_operations") \
        else pytest.skip("this torch does not expose ScheduleDualPipeV's per-rank order")
    kinds = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
    for rank in range(4):
        theirs = [(kinds[str(a.computation_type)], a.microbatch_index, a.stage_index)
                  for a in order(None, rank) if a is not None and str(a.computation_type) in kinds]
        ours = [(a.kind, a.microbatch, stage_of(rank, a.chunk, 4, "v")) for a in dualpipev_order(4, 10, rank)]
        assert ours == theirs


def test_the_v_places_stage_r_and_2p_minus_1_minus_r_on_rank_r():
    assert [[stage_of(r, c, 4, "v") for c in (0, 1)] for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert all(rank_and_chunk(stage_of(r, c, 4, "v"), 4, "v") == (r, c) for r in range(4) for c in (0, 1))


@given(p=st.integers(1, 6), extra=st.integers(0, 8))
def test_dualpipev_is_deadlock_free_complete_and_holds_2p_plus_1_chunks(p, extra):
    m = 2 * p + extra
    schedule = get_schedule("dualpipev", p, m, 2)
    report = check_schedule(schedule, p, m, 2, placement="v")  # rendezvous; raises on deadlock or missing work
    assert report.peak_activations == [2 * p + 1] * p  # DeepSeek's PP+1 stages' worth, PP = 2p chunks
    for rank, actions in enumerate(schedule):  # the turn of the V (rank p-1) sends nothing to itself
        assert all(a.peer != rank for a in actions if not a.is_compute)
        for chunk in (0, 1):  # each chunk's weight gradients in micro-batch order (same float sums)
            weights = [a.microbatch for a in actions if a.kind in ("backward", "backward_weight") and a.chunk == chunk]
            assert weights == list(range(m))


def test_the_loop_placement_rejects_a_v_schedule():
    with pytest.raises(ScheduleError):
        check_schedule(dualpipev(3, 6), 3, 6, 2)


@pytest.mark.parametrize("p, m", [(4, 7), (2, 3)])
def test_fewer_than_2p_micro_batches_are_refused(p, m):
    with pytest.raises(ValueError, match=f"dualpipev needs at least 2·p = {2 * p} micro-batches for p={p} ranks, "
                                         f"got m={m}"):
        dualpipev(p, m)


def test_dualpipev_idles_less_than_1f1b_on_as_many_stages():
    # 8 stages of equal work: 1F1B on 8 ranks vs DualPipeV on 4 (each rank twice the work), m = 16.
    p, m = 4, 16
    v = Timeline(check_schedule(dualpipev(p, m), p, m, 2, weight_time=1.0, placement="v").events, p)
    one = Timeline(check_schedule(get_schedule("1f1b", 2 * p, m), 2 * p, m).events, 2 * p)
    assert v.bubble_fraction() < one.bubble_fraction()


TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "4", "--batch", "8", "--digits", "2", "--steps", "2",
        "--dtype", "float64", "--schedule", "dualpipev", "--chunks", "2", "--microbatches", "4"]


@pytest.mark.parametrize("threads, layout", [(2, ["--pp", "2"]), (4, ["--pp", "2", "--dp", "2"]),
                                             (4, ["--pp", "2", "--tp", "2"]),
                                             (2, ["--pp", "2", "--n-layer", "6", "--balance", "1,2,2,1"])])
def test_check_passes_on_threads_with_dp_and_tp(threads, layout, capsys):
    result = main(TINY + ["--threads", str(threads), *layout, "--check"])
    assert result["check"] <= 1e-9


@pytest.mark.parametrize("extra, message", [
    (["--chunks", "1"], "--schedule dualpipev holds two stages per pp rank (r and 2·pp-1-r): give --chunks 2, "
                        "got --chunks 1"),
    (["--microbatches", "2"], "--schedule dualpipev needs --microbatches ≥ 2·pp = 4, got 2"),
    (["--model", "bert"], "--schedule dualpipev with --model bert"),
    (["--balance", "1,2,1"], "--balance: balance [1, 2, 1] has 3 entries for 4 pipeline stages (--pp 2 x --chunks 2)"),
])
def test_bad_dualpipev_flags_get_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--threads", "2", "--pp", "2", *extra])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@requires_mpiexec
@pytest.mark.parametrize("layout", [pytest.param(["--pp", "4", "--microbatches", "8", "--batch", "16", "--n-layer", "8"],
                                                 marks=pytest.mark.deep),
                                    ["--pp", "2", "--dp", "2"]])
def test_check_passes_on_real_ranks(layout):
    result = run_mpi(4, ["-m", "parallel.train", *TINY, *layout, "--check"], timeout=180)
    difference = float(re.search(r"^check: largest relative difference .*: (\S+) ", result.stdout, re.M).group(1))
    assert difference <= 1e-9


@pytest.mark.parametrize("forward, backward, weight", [(1, 2, 1), (2, 3, 1), (1, 1.25, 0.25)])
@pytest.mark.parametrize("pp, m", [(4, 8), (8, 16), (8, 20)])
def test_table_2_bubbles_hold_at_their_design_points(pp, m, forward, backward, weight):
    # 1F1B at any costs; DualPipeV where the backward's input part equals the forward and W fits a gap: B - W = F >= W
    assert simulated_idle("1f1b", pp, m, forward, backward, weight) == formula("1f1b", pp, forward, backward, weight)
    assert simulated_idle("dualpipev", pp, m, forward, backward, weight) == pytest.approx(
        formula("dualpipev", pp, forward, backward, weight), abs=1e-12)
    if forward == backward - weight == weight:  # ZB-H1's design point
        assert simulated_idle("zb-h1", pp, m, forward, backward, weight) == formula("zb-h1", pp, forward, backward,
                                                                                   weight)


def test_the_table_prints_dualpipev_with_2x_parameters_and_pp_plus_1_activations(capsys):
    assert bench_main(["--stages", "4", "--microbatches", "8", "--costs", "1,2,1"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["DualPipeV"][1] == "2" and rows["DualPipeV"][-2] == "5" and rows["1F1B"][-2] == "4"  # PP+1, PP
    assert 1.9 < float(rows["DualPipeV"][-3].rstrip("x")) <= 2.0  # two stages per device (the ends differ a little)
    assert bench_main(["--stages", "5"]) == 2
    assert bench_main(["--costs", "1,x,1"]) == 2 and bench_main(["--costs", "1,1,2"]) == 2
    assert "--costs 1,1,2: give F,B,W, three numbers" in capsys.readouterr().err


def test_a_weight_part_longer_than_the_forward_idles_more_than_table_2_says():
    assert simulated_idle("dualpipev", 8, 16, 0.5, 1.25, 0.75) == 4.25 > formula("dualpipev", 8, 0.5, 1.25, 0.75) == 2.25
