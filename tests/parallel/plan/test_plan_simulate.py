"""The step simulation on hand-made costs whose answer is known (no timing here)."""
import pytest

from parallel.pipeline.checker import simulate
from parallel.pipeline.registry import get_schedule
from parallel.plan import GPTConfig, Layout, estimate, load_profile, param_count
from parallel.plan.shared_cores import rate, replay
from parallel.plan.simulate import PartCosts, simulate_step, stage_times

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=4, n_head=4, d_model=16)
BLOCK_ONLY = PartCosts(embed=(0.0, 0.0), block=(1.0, 2.0), head=(0.0, 0.0), optimizer_per_param=0.0)


def free_links():
    """The laptop profile with links that cost nothing: only the schedule shapes the time."""
    profile = dict(load_profile("laptop-cpu"))
    for kind in ("intra", "inter"):
        profile[kind] = {"alpha_us": 0.0, "bandwidth_gbps": float("inf")}
    return profile


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 4), (4, 8)])
def test_equal_stages_take_m_plus_p_minus_one_stage_times(schedule, p, m):
    # each stage: n_layer/p blocks of F = 1, B = 2 per micro-batch
    step = simulate_step(CONFIG, Layout(pp=p, micro_batches=m, schedule=schedule), 8 * m, BLOCK_ONLY, free_links())
    t_stage = CONFIG.n_layer // p * 3.0
    assert step.total == pytest.approx((m + p - 1) * t_stage)


def test_the_slowest_stage_sets_the_pace():
    """GPipe, stage 0 one block (F 1, B 2), stage 1 three (F 3, B 6), m = 2: stage 0's first
    forward, then stage 1 busy for m·(3 + 6), then stage 0's last backward: 1 + 18 + 2."""
    step = simulate_step(CONFIG, Layout(pp=2, micro_batches=2, schedule="gpipe"), 16, BLOCK_ONLY, free_links(),
                         balance=[1, 3])
    assert step.stage_times == [(1.0, 2.0), (3.0, 6.0)]
    assert step.total == pytest.approx(21.0)


def test_stage_times_add_the_tensor_parallel_collectives():
    parts = PartCosts(embed=(10.0, 20.0), block=(1.0, 2.0), head=(100.0, 200.0), optimizer_per_param=0.0)
    one = lambda elements: 1000.0 if elements == 2 * 8 * 16 else 1e6  # noqa: E731 - an activation all-reduce
    small = lambda elements: 0.5 if elements == 2 * 8 else one(elements)  # noqa: E731 - b·s floats
    (first, last) = stage_times(CONFIG, Layout(tp=2, pp=2), 2, parts, [2, 2], small)
    assert first == (2 * (1 + 2000) + 10 + 1000, 2 * (2 + 2000) + 20)
    assert last == (2 * (1 + 2000) + 100 + 3 * 0.5, 2 * (2 + 2000) + 200 + 1000)


def test_recomputation_runs_each_stage_forward_again_in_its_backward():
    parts = PartCosts(embed=(10.0, 20.0), block=(1.0, 2.0), head=(100.0, 200.0), optimizer_per_param=0.0)
    free = lambda elements: 0.0  # noqa: E731
    plain = stage_times(CONFIG, Layout(pp=2), 2, parts, [2, 2], free)
    recomputed = stage_times(CONFIG, Layout(pp=2, recompute=True), 2, parts, [2, 2], free)
    assert recomputed == [(f, b + f) for f, b in plain]


def test_collectives_fitted_on_a_group_size_replace_the_link_for_groups_of_that_size():
    profile, parts = load_profile("laptop-cpu"), PartCosts((0.0, 0.0), (1.0, 2.0), (0.0, 0.0), 0.0)
    layout = Layout(dp=2, micro_batches=2)
    slow = {"alpha_us": 1000.0, "bandwidth_gbps": 0.01}
    fitted = simulate_step(CONFIG, layout, 8, parts, profile, collectives={2: slow})
    assert fitted.dp == estimate(CONFIG, layout, 8, {**profile, "intra": slow, "inter": slow}).comm["dp"]
    assert fitted.dp > simulate_step(CONFIG, layout, 8, parts, profile).dp
    assert simulate_step(CONFIG, layout, 8, parts, profile, collectives={4: slow}).dp == \
        simulate_step(CONFIG, layout, 8, parts, profile).dp    # no fit for groups of 2: the profile's link


def test_data_parallel_adds_the_gradient_reduction_and_the_optimizer_after_the_pipeline():
    profile, parts = load_profile("laptop-cpu"), PartCosts((0.0, 0.0), (1.0, 2.0), (0.0, 0.0), 1e-6)
    layout = Layout(dp=2, micro_batches=2)
    step = simulate_step(CONFIG, layout, 8, parts, profile)
    dp = estimate(CONFIG, layout, 8, profile).comm["dp"]
    assert dp > 0 and step.dp == dp
    assert step.total == pytest.approx(2 * 4 * 3.0 + dp + param_count(CONFIG) * 1e-6)


@pytest.mark.parametrize("name, p, m", [("gpipe", 2, 3), ("1f1b", 4, 6), ("zb-h1", 3, 4), ("1f1b", 3, 1)])
def test_with_a_core_per_rank_the_replay_is_the_checkers_simulation(name, p, m):
    forward, backward = [1.0 + s for s in range(p)], [2.0 + s for s in range(p)]
    times = [{"forward": f, "backward": b, "backward_input": b / 2, "backward_weight": b / 2}
             for f, b in zip(forward, backward)]
    expected = simulate(get_schedule(name, p, m), p, m, forward_time=forward, backward_time=backward, comm_time=0.25)
    got = replay(get_schedule(name, p, m), times, 0.25, ranks_per_stage=2)
    ends = lambda events: sorted((e.rank, e.kind, e.microbatch, e.chunk, round(e.end, 9)) for e in events)  # noqa: E731
    assert ends(got) == ends(expected)    # (a receive's start there: when it began waiting)


def test_a_lone_stage_runs_faster_when_the_ranks_share_the_cores():
    """GPipe p=4, m=1, F=1 and B=2 measured with all four computing, a rank alone twice as
    fast: only one stage ever computes, so the step takes half of 4·(1 + 2)."""
    times = [{"forward": 1.0, "backward": 2.0}] * 4
    events = replay(get_schedule("gpipe", 4, 1), times, 0.0, alone_speedup=2.0)
    assert max(e.end for e in events) == pytest.approx(6.0)
    assert rate(4, 4, 2.0) == 1 and rate(1, 4, 2.0) == 2 and rate(3, 4, 1.6) == pytest.approx(1.2)


def test_two_stages_computing_at_once_share_the_speed_up():
    """GPipe p=2, m=2, F = B = 1, a rank alone 2x faster (rate 1 when both compute). Phases:
    stage 0's F0 alone 0.5; F1 ‖ stage 1's F0: 1; stage 1's F1 alone 0.5, its B0 alone 0.5;
    stage 0's B0 ‖ stage 1's B1: 1; stage 0's B1 alone 0.5. In all 4 (6 without sharing)."""
    times = [{"forward": 1.0, "backward": 1.0}] * 2
    assert max(e.end for e in replay(get_schedule("gpipe", 2, 2), times, 0.0, alone_speedup=2.0)) == pytest.approx(4.0)
    assert max(e.end for e in replay(get_schedule("gpipe", 2, 2), times, 0.0)) == pytest.approx(6.0)
