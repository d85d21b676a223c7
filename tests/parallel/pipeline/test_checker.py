"""The checker: every generated schedule passes; broken lists are named."""
import pytest
from hypothesis import given
from strategies import pipeline_shapes

from parallel.pipeline import (
    Action,
    ScheduleDeadlockError,
    ScheduleError,
    check_schedule,
    get_schedule,
    gpipe,
    one_f_one_b,
)


@given(pipeline_shapes())
def test_every_schedule_passes_and_stores_the_expected_activations(shape):
    name, p, m, v = shape
    peak = check_schedule(get_schedule(name, p, m, v), p, m, v).peak_activations
    if name == "gpipe":
        assert peak == [m] * p
    elif v == 1:
        assert peak == [min(p - r, m) for r in range(p)]     # <= p - r <= p
    else:
        # Megatron: warm-up of (p-r-1)*2 + (v-1)*p units, one more in flight.
        assert peak == [min((p - r - 1) * 2 + (v - 1) * p + 1, m * v) for r in range(p)]


def naive_1f1b(p, m):
    """1F1B with each receive right before its compute and each send right after."""
    schedule = []
    for r, actions in enumerate(one_f_one_b(p, m)):
        naive = []
        for a in (a for a in actions if a.is_compute):
            if a.kind == "forward" and r > 0:
                naive.append(Action("recv_fwd", a.microbatch, 0, r - 1))
            if a.kind == "backward" and r < p - 1:
                naive.append(Action("recv_bwd", a.microbatch, 0, r + 1))
            naive.append(a)
            if a.kind == "forward" and r < p - 1:
                naive.append(Action("send_fwd", a.microbatch, 0, r + 1))
            if a.kind == "backward" and r > 0:
                naive.append(Action("send_bwd", a.microbatch, 0, r - 1))
        schedule.append(naive)
    return schedule


def test_naive_1f1b_deadlocks_under_rendezvous():
    with pytest.raises(ScheduleDeadlockError) as error:
        check_schedule(naive_1f1b(2, 3), 2, 3)
    assert [(r, str(a)) for r, a in error.value.cycle] == [
        (0, "send_fwd(mb=1, chunk=0) to rank 1"),
        (1, "send_bwd(mb=0, chunk=0) to rank 0")]
    assert "cycle of ranks [0, 1]" in str(error.value)


def test_swapped_sends_deadlock_and_name_the_cycle():
    schedule = gpipe(2, 2)
    F0, send0, F1, send1 = schedule[0][:4]
    schedule[0][:4] = [F0, F1, send1, send0]
    with pytest.raises(ScheduleDeadlockError) as error:
        check_schedule(schedule, 2, 2)
    assert str(error.value) == (
        "deadlock: rank 0 blocks in send_fwd(mb=1, chunk=0) to rank 1 -> rank 1 blocks in "
        "recv_fwd(mb=0, chunk=0) from rank 0 -> back to rank 0 (wait-for cycle of ranks [0, 1])")


def test_a_send_nobody_receives_waits_on_a_finished_rank():
    with pytest.raises(ScheduleDeadlockError, match="rank 1 has finished its list"):
        check_schedule([gpipe(2, 1)[0], []], 2, 1)


def test_missing_receive_is_named():
    schedule = gpipe(2, 2)
    schedule[1].remove(Action("recv_fwd", 1, 0, 0))
    with pytest.raises(ScheduleError, match=r"rank 1: forward\(mb=1, chunk=0\) runs without "
                                            r"its input: no recv_fwd of micro-batch 1"):
        check_schedule(schedule, 2, 2)


def test_backward_before_forward_is_rejected():
    with pytest.raises(ScheduleError, match=r"backward\(mb=0, chunk=0\) \(stage 0\) runs before "
                                            r"forward of micro-batch 0 at stage 0"):
        check_schedule([[Action("backward", 0), Action("forward", 0)]], 1, 1)


def test_forward_before_previous_stage_is_rejected():
    schedule = [[Action("recv_bwd", 0, 0, 1)], [Action("forward", 0)]]
    with pytest.raises(ScheduleError, match="stage 1.* runs before forward of micro-batch 0 at "
                                            "stage 0"):
        check_schedule(schedule, 2, 1)


@pytest.mark.parametrize("schedule, p, m, words", [
    ([[Action("forward", 0)]], 1, 1, "never runs backward of micro-batches [0]"),
    ([[Action("forward", 0), Action("forward", 0), Action("backward", 0)]], 1, 1, "runs twice"),
    ([[Action("forward", 0), Action("backward", 0)]], 2, 1, "1 rank lists, expected p=2"),
    ([[Action("forward", 3), Action("backward", 3)]], 1, 1, "out of range"),
    ([[Action("forward", 0, 0, 0)]], 1, 1, "compute actions have no peer"),
    ([[Action("send_fwd", 0, 0, 0)]], 1, 1, "has no neighbour stage 1"),
    ([[Action("F", 0)]], 1, 1, "is not an Action"),
    ([[], [Action("recv_fwd", 0, 0, 2)], []], 3, 1, "stage 0 lives on rank 0, not rank 2"),
])
def test_malformed_lists_are_named(schedule, p, m, words):
    with pytest.raises(ScheduleError) as error:
        check_schedule(schedule, p, m)
    assert words in str(error.value)


def test_send_before_its_compute_and_double_message_are_rejected():
    schedule = gpipe(2, 1)
    schedule[0] = [schedule[0][1], schedule[0][0]] + schedule[0][2:]
    with pytest.raises(ScheduleError, match=r"send_fwd\(mb=0.*before its forward was computed"):
        check_schedule(schedule, 2, 1)
    schedule = gpipe(2, 1)
    schedule[1].insert(1, schedule[1][0])
    schedule[0].insert(2, schedule[0][1])
    with pytest.raises(ScheduleError, match=r"send_fwd\(mb=0, chunk=0\) to rank 1 happens twice"):
        check_schedule(schedule, 2, 1)
