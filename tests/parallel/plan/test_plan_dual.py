"""DualPipe and DualPipeV in the planner (plan.dual): the stages a rank holds, their bubble against the
replayed schedule, 2× parameters, the V's ends on rank 0, its activations, and where each schedule wins."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import parallel
from parallel import run_threads
from parallel.alpha_beta import ring_all_reduce
from parallel.pipeline.checker import check_schedule
from parallel.pipeline.registry import get_schedule
from parallel.plan import GPTConfig, Layout, estimate, load_profile, param_bytes_per_rank, param_count, plan
from parallel.plan.__main__ import main
from parallel.plan.cluster import figures, group_link, step
from parallel.plan.cluster_memory import DTYPE
from parallel.plan.cluster_search import best_steps
from parallel.plan.cost import bubble_slots, link
from parallel.plan.dual import dual_bubble_slots, dual_error, held_stages, in_flight_stages, table2_bubble
from parallel.plan.layout import get_precision
from parallel.plan.memory import activation_bytes_per_rank, block_activation_bytes
from parallel.plan.simulate import PartCosts, simulate_step
from parallel.plan.validate import memory_errors
from parallel.plan.validate_worker import run_layout

CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=8, n_head=2, d_model=32)
GPT3 = GPTConfig(vocab_size=51200, block_size=2048, n_layer=96, n_head=96, d_model=12288)


def free_links():
    profile = dict(load_profile("laptop-cpu"))
    for kind in ("intra", "inter"):
        profile[kind] = {"alpha_us": 0.0, "bandwidth_gbps": float("inf")}
    return profile


def blocks_only(forward, backward):
    return PartCosts(embed=(0.0, 0.0), block=(forward, backward), head=(0.0, 0.0), optimizer_per_param=0.0)


def test_each_rank_holds_two_stages():
    assert [held_stages("dualpipev", 3, r) for r in range(3)] == [[(0, 1), (5, 1)], [(1, 1), (4, 1)], [(2, 1), (3, 1)]]
    assert [held_stages("dualpipe", 4, r) for r in (0, 3)] == [[(0, 0.5), (3, 0.5)], [(3, 0.5), (0, 0.5)]]
    assert held_stages("1f1b", 4, 2) == [(2, 1)]


def test_bad_dual_layouts_get_one_line_errors():
    assert "even pp" in dual_error("dualpipe", 3, 8, 12)
    assert "at least 2·pp = 8" in dual_error("dualpipev", 4, 7, 8)
    assert "8 stages from n_layer=6" in dual_error("dualpipev", 4, 8, 6)
    assert dual_error("dualpipev", 4, 8, 8) is None
    with pytest.raises(ValueError, match="at least 2·pp"):
        estimate(CONFIG, Layout(pp=4, micro_batches=4, schedule="dualpipev"), 4, "laptop-cpu")


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 4), forward=st.sampled_from([0.25, 1.0, 3.0]))
def test_the_bubble_is_table_2s_where_the_replayed_v_reaches_its_steady_state(p, extra, forward):
    """Stages of F, B_in = W = F (the design point, B = 2F): the planner's bubble, table 2 with PP = 2p,
    equals the replay of the V's own lists once m ≥ 3p; from 2p on the replay is never longer."""
    m = 2 * p + extra * p // 2
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=2 * p, n_head=2, d_model=32)
    step = simulate_step(config, Layout(pp=p, micro_batches=m, schedule="dualpipev"), m, blocks_only(forward, 2 * forward),
                         free_links())
    t = 2 * 3 * forward                                   # a rank's two stages, one block each
    idle, predicted = max(step.stage_ends) - m * t, dual_bubble_slots("dualpipev", p) * t
    assert predicted == pytest.approx(table2_bubble(2 * p, forward, 2 * forward, forward))
    if m >= 3 * p:
        assert idle == pytest.approx(predicted, rel=1e-9)
    assert idle <= predicted * (1 + 1e-9)


@settings(max_examples=20, deadline=None)
@given(half=st.integers(1, 3), extra=st.integers(0, 4), forward=st.sampled_from([0.25, 1.0, 3.0]))
def test_the_bubble_is_table_2s_where_the_replayed_dualpipe_reaches_its_steady_state(half, extra, forward):
    """Bidirectional DualPipe's own lists (placement 'mirror': rank r holds stage r down and stage p−1−r up,
    m/2 micro-batches each way), stages of F, B_in = W = F: a rank computes m·3F, and the replay idles
    table 2's (p/2 − 1)(F&B + B − 3W) with PP = p once m ≥ 3p − 4; from 2p on never more."""
    p = 2 * half
    m = 2 * p + 2 * extra
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=p, n_head=2, d_model=32)
    step = simulate_step(config, Layout(pp=p, micro_batches=m, schedule="dualpipe"), m, blocks_only(forward, 2 * forward),
                         free_links())
    idle, predicted = max(step.stage_ends) - m * 3 * forward, table2_bubble(p, forward, 2 * forward, forward)
    assert predicted == pytest.approx(dual_bubble_slots("dualpipe", p) * 3 * forward)
    if m >= 3 * p - 4:
        assert idle == pytest.approx(predicted, rel=1e-9, abs=1e-12)
    assert idle <= predicted * (1 + 1e-9) + 1e-12


def test_dualpipe_holds_twice_the_parameters_and_the_v_once_with_both_ends_on_rank_0():
    whole = param_count(CONFIG)
    dual = [param_bytes_per_rank(CONFIG, 1, 1, 4, (0, 0, r), schedule="dualpipe")["params"] / 4 for r in range(4)]
    v = [param_bytes_per_rank(CONFIG, 1, 1, 4, (0, 0, r), schedule="dualpipev")["params"] / 4 for r in range(4)]
    assert sum(dual) == 2 * whole and sum(v) == whole
    ends = 2 * CONFIG.vocab_size * CONFIG.d_model + CONFIG.block_size * CONFIG.d_model + 2 * CONFIG.d_model
    assert v[0] - v[1] == ends                          # tok_emb, pos_emb, ln_f and lm_head, all on rank 0


def test_the_v_holds_the_activations_its_lists_hold():
    """The checker's peak stored (micro-batch, chunk) graphs: 2p + 1 on rank 0 (table 2's PP + 1), times a chunk's blocks."""
    peaks = check_schedule(get_schedule("dualpipev", 4, 8, 2), 4, 8, 2, placement="v").peak_activations
    assert [in_flight_stages("dualpipev", 8, 4, r) for r in range(4)] == peaks and peaks[0] == 9
    layout = Layout(pp=4, micro_batches=8, schedule="dualpipev")
    assert activation_bytes_per_rank(CONFIG, layout, 1, 0) == 9 * block_activation_bytes(CONFIG, 1)
    assert in_flight_stages("dualpipe", 16, 4, 0) == 5


def test_the_v_beats_1f1b_and_zero_bubble_where_w_is_large():
    """The replay of every schedule's lists with a backward of 3F (W = B/2 = 1.5F > F: e.g. a CPU's measured
    backward): the V idles least; at the flop count's B = 2F it ties ZB-H1, and the closed form (flops) says so."""
    def total(schedule, backward):
        return simulate_step(CONFIG, Layout(pp=4, micro_batches=16, schedule=schedule), 16, blocks_only(1.0, backward),
                             free_links()).total
    heavy = {name: total(name, 3.0) for name in ("1f1b", "zb-h1", "zb-h2", "dualpipev")}
    assert min(heavy, key=heavy.get) == "dualpipev" and heavy["dualpipev"] < heavy["zb-h2"] < heavy["1f1b"]
    assert total("dualpipev", 2.0) == pytest.approx(total("zb-h1", 2.0))
    assert bubble_slots("dualpipev", 4, 16) == pytest.approx(bubble_slots("zb-h1", 4, 16)) == 1.0  # (p − 1)/3 t


def test_among_pipelines_the_search_takes_dualpipe_where_its_parameters_fit():
    """Table 2 with F = B_in = W: DualPipe's (pp/2 − 1)·2t/3 beats ZB-H1's (pp − 1)t/3 on 4 pipeline ranks, its
    mirrored all-reduce included; with too little memory for its second copy the search takes a one-copy
    schedule. (On this profile 4 data-parallel replicas beat every pipeline: DualPipe pays for its pair sums.)"""
    config = GPTConfig(vocab_size=256, block_size=128, n_layer=8, n_head=8, d_model=512)
    def pipelines(**memory):
        return [est for est in plan(config, 4, 32, "laptop-cpu", schedule="any", **memory).ranked if est.layout.pp == 4]
    assert pipelines()[0].layout.schedule == "dualpipe"
    assert plan(config, 4, 32, "laptop-cpu", schedule="any").ranked[0].layout.dp == 4
    one_copy = min(est.memory["total"] for est in plan(config, 4, 32, "laptop-cpu", schedule="zb-h1").ranked
                   if est.layout.pp == 4)
    tight = pipelines(memory_bytes=one_copy)
    assert tight and all(est.layout.schedule != "dualpipe" for est in tight)


@pytest.mark.parametrize("recompute, winner", [("full", "1f1b"), ("selective", "dualpipe")])
def test_on_a_cluster_interleaving_wins_under_full_recomputation_and_dualpipe_under_selective(recompute, winner):
    """GPT-3 175B, tp 8 × pp 16 × dp 8 A100s: with full recomputation the W's cannot wait (they run inside B)
    and interleaving with many virtual stages has the smaller bubble; with selective recomputation DualPipe's
    deferred W's fill it, and with 64 GiB its 2× parameters no longer fit and the V takes its place."""
    best = best_steps(GPT3, load_profile("a100-80gb"), 1024, 1536, tp=8, pp=16, recompute=recompute, schedule=None)[0]
    assert (best.schedule, best.fits) == (winner, True)
    assert best.chunks > 2 if winner == "1f1b" else best.chunks == 1
    tight = {**load_profile("a100-80gb"), "memory_gib": 64}
    assert best_steps(GPT3, tight, 1024, 1536, tp=8, pp=16, recompute="selective", schedule=None)[0].schedule == "dualpipev"


def test_on_a_cluster_dualpipe_sums_every_gradient_of_a_rank_with_its_pair_rank():
    """MirroredGradients all-reduces both stages a DualPipe rank holds with the rank holding their other copies:
    all of the rank's parameters, over a group of 2 (dp·tp ranks apart); the V holds no copies and pays none."""
    gpu, precision = figures(load_profile("a100-80gb")), get_precision(DTYPE)
    dual, v = (step(GPT3, load_profile("a100-80gb"), 1536, 8, 16, 8, 1, recompute="selective", schedule=name)
               for name in ("dualpipe", "dualpipev"))
    params = dual.memory["params"] / precision.param_bytes
    pair = ring_all_reduce(2, params * precision.dp_grad_bytes, *group_link(gpu, 8 * 8, 2))
    assert dual.seconds["embedding_sync"] == pytest.approx(pair, rel=1e-12) and v.seconds["embedding_sync"] == 0.0


def test_the_small_planner_charges_dualpipes_mirrored_all_reduce_on_the_pp_link():
    """At dp = 1 DualPipe's only dp-time is the pair all-reduce of all a rank's gradients (both copies'
    stages, the largest rank's); the V and 1F1B hold no copies."""
    config = GPTConfig(vocab_size=256, block_size=128, n_layer=8, n_head=8, d_model=512)
    times = {name: estimate(config, Layout(pp=4, micro_batches=8, schedule=name), 32, "laptop-cpu").comm["dp"]
             for name in ("1f1b", "dualpipev", "dualpipe")}
    largest = max(param_bytes_per_rank(config, 1, 1, 4, (0, 0, r), schedule="dualpipe")["params"] for r in range(4))
    profile = load_profile("laptop-cpu")
    assert times["dualpipe"] == pytest.approx(ring_all_reduce(2, largest, *link(profile, 1, 4)[1:]), rel=1e-12)
    assert times["1f1b"] == times["dualpipev"] == 0.0


def test_the_command_line_plans_dual_schedules(capsys):
    assert main(["--config", "medium", "--devices", "4", "--batch", "32", "--schedule", "dualpipev", "--top", "1"]) == 0
    assert "dualpipev" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--config", "medium", "--devices", "4", "--batch", "32", "--schedule", "dualpipes"])


def test_a_measured_dualpipev_step_holds_the_bytes_the_planner_predicts_on_every_rank():
    """The validation's worker trains the V (HybridGPT, two threads): rank 0's embedding and head included,
    every rank's parameter, gradient and optimizer bytes equal param_bytes_per_rank's."""
    config = GPTConfig(vocab_size=10, block_size=4, n_layer=4, n_head=2, d_model=8)
    layout = (1, 1, 2, 0, False, "dualpipev")
    times, memory = run_threads(2, lambda: run_layout(parallel.world(), config, layout, 4, 4, 1))[0]
    rows = memory_errors(config, [{"layout": layout, "memory": memory}])
    assert len(rows) == 2 * 3 and all(error == 0 for *_, error in rows)
    assert memory[0]["params"] > memory[1]["params"]               # both ends on rank 0
