"""Zero-bubble schedules: checked deadlock-free, bubbles equal the closed forms, memory as stated."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from parallel.pipeline import Action, ScheduleError, Timeline, bubble_theory, check_schedule, get_schedule, zb_h1, zb_h2

ZB = st.sampled_from(["zb-h1", "zb-h2"])
RANKS, MICROBATCHES = st.integers(1, 8), st.integers(1, 16)


def computes(actions):
    letters = {"forward": "F", "backward_input": "B", "backward_weight": "W"}
    return " ".join(f"{letters[a.kind]}{a.microbatch}" for a in actions if a.is_compute)


def test_zb_h1_two_ranks_three_microbatches():
    # Rank 1 (the last) runs its W one micro-batch late; rank 0 keeps 1F1B's warm-up.
    assert [computes(actions) for actions in zb_h1(2, 3)] == [
        "F0 F1 B0 W0 F2 B1 W1 B2 W2",
        "F0 B0 F1 B1 W0 F2 B2 W1 W2",
    ]


def test_zb_h2_warms_up_with_2p_minus_2r_minus_1_forwards():
    for rank, actions in enumerate(zb_h2(3, 8)):
        kinds = [a.kind for a in actions if a.is_compute]
        assert kinds.index("backward_input") == 2 * (3 - rank) - 1


@given(name=ZB, p=RANKS, m=MICROBATCHES)
def test_every_zero_bubble_schedule_is_deadlock_free_and_complete(name, p, m):
    schedule = get_schedule(name, p, m)
    check_schedule(schedule, p, m)  # strict rendezvous; raises on deadlock, order or missing work
    for actions in schedule:
        done = set()
        for a in (a for a in actions if a.is_compute):
            if a.kind == "backward_weight":
                assert ("backward_input", a.microbatch) in done
            done.add((a.kind, a.microbatch))
        assert {mb for kind, mb in done if kind == "backward_weight"} == set(range(m))


@given(name=ZB, p=RANKS, m=MICROBATCHES)
def test_simulated_bubble_at_equal_costs_equals_the_closed_form(name, p, m):
    # F = B = W = 1: forward 1, a whole backward 2 of which W is 1.
    timeline = Timeline(check_schedule(get_schedule(name, p, m), p, m, weight_time=1.0).events, p)
    assert timeline.bubble_fraction() == pytest.approx(1 - 3 * m / (2 * m + p - 1 + max(m, p)), abs=1e-12)
    assert timeline.bubble_fraction() == pytest.approx(bubble_theory(p, m, schedule=name), abs=1e-12)
    if m >= p:  # a third of 1F1B's idle time per rank: (p-1)/(3m+p-1)
        assert timeline.bubble_fraction() == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)


@given(p=RANKS, m=MICROBATCHES)
def test_1f1b_at_equal_costs_idles_three_times_as_long(p, m):
    one_f_one_b = Timeline(check_schedule(get_schedule("1f1b", p, m), p, m).events, p)
    zb = Timeline(check_schedule(get_schedule("zb-h1", p, m), p, m).events, p)
    idle = [t.bubble_fraction() * t.makespan for t in (one_f_one_b, zb)]  # per rank, averaged
    if m >= p:
        assert idle[0] == pytest.approx(3 * idle[1], abs=1e-9)


@given(p=RANKS, m=MICROBATCHES)
def test_zb_h1_peak_activations_equal_1f1b_and_zb_h2_holds_at_most_2p_minus_1(p, m):
    def peaks(name):
        return check_schedule(get_schedule(name, p, m), p, m).peak_activations

    assert max(peaks("zb-h1")) == max(peaks("1f1b")) == min(p, m)
    assert peaks("zb-h1") == [min(p, m)] * p  # W lagging r micro-batches on rank r
    assert max(peaks("zb-h2")) <= min(2 * p - 1, m)


@given(p=RANKS, m=MICROBATCHES)
def test_zb_h2_leaves_no_bubble_inside_a_rank_from_m_at_least_2p_minus_1(p, m):
    h2 = Timeline(check_schedule(zb_h2(p, m), p, m).events, p)
    h1 = Timeline(check_schedule(zb_h1(p, m), p, m).events, p)
    if m >= 2 * p - 1:
        assert h2.inner_bubble_fraction() == 0
    if p > 1:  # rank 0 of ZB-H1 waits p-1 slots for its first gradient
        assert h1.inner_bubble_fraction() > 0


def test_b_pending_until_w_is_counted():
    report = check_schedule(zb_h1(4, 8), 4, 8)
    assert report.peak_weight_pending == [1, 2, 3, 4]  # rank r: its own B plus r late W's


def test_w_before_its_b_is_rejected():
    schedule = [[Action("forward", 0), Action("backward_weight", 0), Action("backward_input", 0)]]
    with pytest.raises(ScheduleError, match=r"backward_weight\(mb=0, chunk=0\) \(stage 0\) runs before "
                                            r"backward_input of micro-batch 0 at stage 0"):
        check_schedule(schedule, 1, 1)


def test_a_missing_w_leaves_the_optimizer_step_without_gradients():
    schedule = [[Action("forward", 0), Action("backward_input", 0)]]
    with pytest.raises(ScheduleError, match=r"never runs backward_weight of micro-batches \[0\] on chunk 0: "
                                            r"gradients incomplete before the optimizer step"):
        check_schedule(schedule, 1, 1)


def test_a_full_backward_after_its_b_runs_twice():
    schedule = [[Action("forward", 0), Action("backward_input", 0), Action("backward", 0)]]
    with pytest.raises(ScheduleError, match="runs twice"):
        check_schedule(schedule, 1, 1)


def test_zero_bubble_schedules_run_one_chunk_per_rank():
    with pytest.raises(ValueError, match="schedule 'zb-h1' runs one model chunk per rank, got v=2"):
        get_schedule("zb-h1", 2, 4, 2)
