"""Timelines: the static simulation's times, the picture, the trace, the bubble."""
import json

import pytest
from hypothesis import given
from strategies import pipeline_shapes

from parallel.pipeline import (
    Event,
    Timeline,
    bubble_theory,
    get_schedule,
    gpipe,
    megatron_bubble_ratio,
    one_f_one_b,
    simulate,
)


def test_simulated_times_of_gpipe():
    compute = [(e.rank, e.kind[0], e.microbatch, e.start, e.end)
               for e in simulate(gpipe(2, 2), 2, 2) if e.kind in ("forward", "backward")]
    assert sorted(compute, key=lambda e: (e[0], e[3])) == [
        (0, "f", 0, 0, 1), (0, "f", 1, 1, 2), (0, "b", 0, 5, 7), (0, "b", 1, 7, 9),
        (1, "f", 0, 1, 2), (1, "f", 1, 2, 3), (1, "b", 0, 3, 5), (1, "b", 1, 5, 7)]


def test_blocked_send_is_an_event_lasting_the_wait():
    # Rank 0 sends activation 1 at t=2; rank 1 computes until t=2 and takes it then.
    sends = [e for e in simulate(gpipe(2, 2), 2, 2) if e.kind == "send_fwd"]
    assert [(e.microbatch, e.start, e.end) for e in sends] == [(0, 1, 1), (1, 2, 2)]


def test_render_gpipe():
    assert Timeline(simulate(gpipe(2, 2), 2, 2)).render() == (
        "rank 0 | F0 F1 .  .  .  B0 B0 B1 B1\n"
        "rank 1 | .  F0 F1 B0 B0 B1 B1 .  .\n"
        "F = forward, B = backward, number = micro-batch, . = idle; one column = 1 time unit(s)")


def test_render_1f1b_and_interleaved():
    assert Timeline(simulate(one_f_one_b(2, 3), 2, 3)).render().splitlines()[:2] == [
        "rank 0 | F0 F1 .  .  B0 B0 F2 B1 B1 .  B2 B2",
        "rank 1 | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 .  ."]
    assert Timeline(simulate(get_schedule("interleaved", 2, 2, 2), 2, 2, 2)).render() == (
        "rank 0 | F0a F1a F0b F1b .   .   B0b B0b .   B1b B1b B0a B0a B1a B1a\n"
        "rank 1 | .   F0a F1a F0b B0b B0b F1b B1b B1b B0a B0a B1a B1a .   .\n"
        "F = forward, B = backward, number = micro-batch, letter = model chunk (a = 0, b = 1, "
        "...), . = idle; one column = 1 time unit(s)")


def test_render_measured_seconds_on_a_coarser_grid():
    events = [Event(0, "forward", 0, 0, 10.000, 10.010), Event(0, "backward", 0, 0, 10.031, 10.050),
              Event(1, "forward", 0, 0, 10.011, 10.020)]
    assert Timeline(events).render(slot=0.01).splitlines()[:2] == [
        "rank 0 | F0 .  .  B0 B0", "rank 1 | .  F0 .  .  ."]


@given(pipeline_shapes(schedule="gpipe"))
def test_gpipe_bubble_equals_theory_for_any_forward_backward_costs(shape):
    _, p, m, v = shape
    for costs in ((1, 1), (1, 2), (2, 3)):
        timeline = Timeline(simulate(gpipe(p, m), p, m, v, *costs), p)
        assert timeline.bubble_fraction() == pytest.approx(bubble_theory(p, m), rel=1e-12)
        assert timeline.makespan == (m + p - 1) * sum(costs)


@given(pipeline_shapes(schedule="1f1b"))
def test_1f1b_bubble_equals_theory(shape):
    _, p, m, v = shape
    for costs in ((1, 1), (1, 2)):
        timeline = Timeline(simulate(one_f_one_b(p, m), p, m, v, *costs), p)
        assert timeline.bubble_fraction() == pytest.approx(bubble_theory(p, m), rel=1e-12)


@given(pipeline_shapes(schedule="interleaved"))
def test_interleaved_bubble_equals_megatron_theory_at_the_placement_costs(shape):
    # The lists order their messages for backward = 2 x forward (see schedules.py);
    # at those costs strict rendezvous reaches Megatron's bubble exactly.
    _, p, m, v = shape
    timeline = Timeline(simulate(get_schedule("interleaved", p, m, v), p, m, v, 1, 2), p)
    assert timeline.bubble_fraction() == pytest.approx(bubble_theory(p, m, v), rel=1e-12)


def test_bubble_theory_formulas():
    assert bubble_theory(4, 8) == pytest.approx(3 / 11)
    assert megatron_bubble_ratio(4, 8, 2) == pytest.approx(3 / 16)
    # ratio = idle / compute, fraction = idle / (idle + compute)
    assert bubble_theory(4, 8, 2) == pytest.approx((3 / 16) / (1 + 3 / 16))
    assert bubble_theory(1, 5, 3) == 0


def test_chrome_trace_is_valid_json_with_one_slice_per_action(tmp_path):
    schedule = one_f_one_b(2, 3)
    timeline = Timeline(simulate(schedule, 2, 3))
    path = tmp_path / "trace.json"
    timeline.save_chrome_trace(path, us_per_unit=1000)
    trace = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in trace if e["ph"] == "X"]
    assert len(slices) == sum(len(actions) for actions in schedule)
    names = {(e["pid"], e["args"]["name"]) for e in trace if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    b0 = [e for e in slices if e["pid"] == 1 and e["name"] == "B0"]
    assert b0 == [{"name": "B0", "cat": "backward", "ph": "X", "pid": 1, "tid": 0,
                   "ts": 2000, "dur": 2000, "args": {"microbatch": 0, "chunk": 0}}]
    assert {e["tid"] for e in slices if e["cat"].startswith(("send", "recv"))} == {1}


def test_timeline_needs_compute_events():
    with pytest.raises(ValueError, match="at least one forward or backward"):
        Timeline([Event(0, "send_fwd", 0, 0, 0.0, 1.0)])


def test_render_never_drops_a_short_event_at_the_end():
    """Rounding a short last event to the grid must widen the picture, not crash it."""
    picture = Timeline([Event(0, "forward", 0, 0, 0, 1), Event(0, "backward", 0, 0, 1, 1.2)]).render(slot=1)
    assert picture.splitlines()[0].split("|")[1].split() == ["F0", "B0"]
