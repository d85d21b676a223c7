"""Step-time model: α–β collectives, compute flops, bubble."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitensor.models.gpt import GPTConfig
from parallel.alpha_beta import all_gather, ring_all_reduce, send_recv
from parallel.pipeline import Timeline, check_schedule, get_schedule
from parallel.plan import Layout, estimate, get_config, load_profile
from parallel.plan.cost import bubble_slots, link, stage_flops
from parallel.plan.model import stage_layers

LAPTOP = load_profile("laptop-cpu")
A100 = load_profile("a100-80gb")
MEDIUM = get_config("medium")


def test_alpha_beta_collectives():
    alpha, beta = 1e-5, 1e-9
    assert ring_all_reduce(1, 1e6, alpha, beta) == 0 == all_gather(1, 1e6, alpha, beta)
    assert ring_all_reduce(4, 4e6, alpha, beta) == pytest.approx(2 * 3 * (1e-5 + 1e-3))
    assert all_gather(4, 4e6, alpha, beta) == pytest.approx(3 * (1e-5 + 1e-3))
    assert send_recv(1e6, alpha, beta) == pytest.approx(1e-5 + 1e-3)


def test_link_is_intra_node_only_when_the_group_fits():
    assert link(A100, 1, 8)[0] == "intra"
    assert link(A100, 2, 4)[0] == "intra"
    assert link(A100, 8, 2)[0] == "inter"
    kind, alpha, beta = link(A100, 16, 4)
    assert kind == "inter"
    assert alpha == pytest.approx(10e-6, rel=1e-12) and beta == pytest.approx(1 / 25e9, rel=1e-12)


@given(st.integers(1, 6), st.integers(1, 3), st.booleans())
def test_stage_flops_sum_to_6NT_plus_attention(pp_layers, b, recompute):
    config = get_config("medium")
    pp = min(pp_layers, config.n_layer)
    s, h, L, V = config.block_size, config.d_model, config.n_layer, config.vocab_size
    tokens = b * s
    total = sum(stage_flops(config, layers, tokens, 1, recompute, stage == pp - 1)
                for stage, layers in enumerate(stage_layers(L, pp)))
    dense = 6 * (12 * L * h * h + V * h) * tokens + 12 * L * b * s * s * h
    again = (2 * 12 * L * h * h * tokens + 4 * L * b * s * s * h) if recompute else 0  # the forward, recomputed
    assert total == pytest.approx(dense + again, rel=1e-12)
    assert stage_flops(config, 2, tokens, 4, recompute, True) == \
        pytest.approx(stage_flops(config, 2, tokens, 1, recompute, True) / 4)


@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 4, 8]))
def test_time_parts_and_bubble_fraction(dp, tp, pp, m):
    layout = Layout(dp=dp, tp=tp, pp=pp, micro_batches=m)
    est = estimate(MEDIUM, layout, batch=64, profile=LAPTOP)
    time, comm = est.time, est.comm
    assert time["total"] == pytest.approx(time["compute"] + time["comm"] + time["bubble"])
    assert time["comm"] == pytest.approx(sum(comm.values()))
    pipelined = time["total"] - comm["dp"]
    assert time["bubble"] == pytest.approx(pipelined * (pp - 1) / (m + pp - 1))
    assert (comm["tp"] == 0) == (tp == 1)
    assert (comm["pp"] == 0) == (pp == 1)
    assert (comm["dp"] == 0) == (dp == 1)


# A model small enough to cost by hand: V=16, s=4, 2 blocks, 2 heads, h=8.
TINY = GPTConfig(vocab_size=16, block_size=4, n_layer=2, n_head=2, d_model=8)
# Two devices per node: a group of 2 adjacent ranks is intra-node, ranks 2 apart are not.
TWO_PER_NODE = {"name": "two-per-node", "peak_flops": {"float32": 1e9}, "efficiency": 0.5, "memory_gib": 1,
                "devices_per_node": 2, "intra": {"alpha_us": 1.0, "bandwidth_gbps": 1.0},
                "inter": {"alpha_us": 10.0, "bandwidth_gbps": 0.1}}


def test_every_term_equals_the_hand_computed_value_for_a_small_layout():
    # dp2·tp2·pp2, m=2, recomputation, float32, batch 8: b = 8/(2·2) = 2 sequences, T = 8 tokens.
    est = estimate(TINY, Layout(dp=2, tp=2, pp=2, micro_batches=2, recompute=True), 8, TWO_PER_NODE)
    intra, inter = (1e-6, 1e-9), (1e-5, 1e-8)   # (α s, β s/B)
    message = 2 * 4 * 8 * 4                     # b·s·h float32 activations = 256 B
    # tp: ranks 0,1 share a node; a ring all-reduce of 2 ranks is 2·1·(α + 128 B·β); recomputation
    # recomputes the forward, so 6 all-reduces per block (4 without); one block per stage.
    tp_mb = 6 * 2 * (intra[0] + message / 2 * intra[1])
    # pp: ranks tp·dp = 4 apart, other node; one send forward and one backward per micro-batch.
    pp_mb = 2 * (inter[0] + message * inter[1])
    # compute, last stage (the slowest: it has lm_head): one block fwd twice + bwd,
    # (8·12·h² + 16·s·h)·T = 53,248 flops, plus lm_head 6·V·h·T = 6,144; / tp; at 1e9·0.5 flop/s.
    compute_mb = (53248 + 6144) / 2 / 5e8
    # dp: ranks tp = 2 apart, so the pair spans two nodes; the largest stage (0: a block of 460
    # parameters per tp rank, half the token table 8·8 and the positions 4·8) has 556 parameters:
    # 2224 B of float32 gradients, a 2-rank ring all-reduce of 2·1·(α + 1112 B·β).
    dp_time = 2 * (inter[0] + 1112 * inter[1])
    expected_comm = {"tp": 2 * tp_mb, "pp": 2 * pp_mb, "dp": dp_time}
    for kind, seconds in expected_comm.items():
        assert est.comm[kind] == pytest.approx(seconds, rel=1e-12), kind
    t_stage = compute_mb + tp_mb + pp_mb
    assert est.time["compute"] == pytest.approx(2 * compute_mb, rel=1e-12)
    assert est.time["bubble"] == pytest.approx(1 * t_stage, rel=1e-12)   # (p − 1)·t_stage
    assert est.time["total"] == pytest.approx(2 * compute_mb + sum(expected_comm.values()) + t_stage, rel=1e-12)
    # The same layout without recomputation: 4 all-reduces per block, 3 passes of the block.
    plain = estimate(TINY, Layout(dp=2, tp=2, pp=2, micro_batches=2), 8, TWO_PER_NODE)
    assert plain.comm["tp"] == pytest.approx(2 * 4 * 2 * (intra[0] + 128 * intra[1]), rel=1e-12)
    assert plain.time["compute"] == pytest.approx(2 * (39936 + 6144) / 2 / 5e8, rel=1e-12)


def test_sequence_parallel_same_time_less_activation_memory():
    plain = estimate(MEDIUM, Layout(tp=2, dp=2), 32, LAPTOP)
    sp = estimate(MEDIUM, Layout(tp=2, dp=2, sequence_parallel=True), 32, LAPTOP)
    assert sp.time == plain.time
    assert sp.memory["activations"] < plain.memory["activations"]


def test_recomputation_trades_flops_for_memory():
    plain = estimate(MEDIUM, Layout(dp=4), 32, LAPTOP)
    recomputed = estimate(MEDIUM, Layout(dp=4, recompute=True), 32, LAPTOP)
    assert recomputed.time["compute"] > plain.time["compute"]
    assert recomputed.memory["activations"] < plain.memory["activations"]


def test_zero1_costs_the_same_dp_time_and_less_optimizer_memory():
    plain = estimate(MEDIUM, Layout(dp=4), 32, LAPTOP)
    zero = estimate(MEDIUM, Layout(dp=4, zero=True), 32, LAPTOP)
    assert zero.comm["dp"] == pytest.approx(plain.comm["dp"])
    assert zero.memory["optim"] == plain.memory["optim"] // 4


def test_mixed_precision_needs_16_bit_flops_and_is_faster_on_gpu():
    with pytest.raises(ValueError, match="no peak flops for dtype 'mixed'"):
        estimate(MEDIUM, Layout(), 8, LAPTOP, dtype="mixed")
    fp32 = estimate(MEDIUM, Layout(), 8, A100, dtype="float32")
    mixed = estimate(MEDIUM, Layout(), 8, A100, dtype="mixed")
    assert mixed.time["compute"] == pytest.approx(fp32.time["compute"] * 19.5 / 312)


def test_explain_lines_show_the_figures():
    est = estimate(MEDIUM, Layout(dp=2, pp=2, micro_batches=4), 32, LAPTOP)
    text = "\n".join(est.lines)
    assert "micro-batch b = batch / (dp·m) = 32 / (2·4) = 4" in text
    assert f"step time = {est.time['total']:.4g} s" in text
    assert "1 micro-batches in flight" not in text and "2 micro-batches in flight" in text


def test_unknown_device_is_named():
    with pytest.raises(ValueError, match="unknown device 'tpu-v9'"):
        load_profile("tpu-v9")


@given(st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2"]), st.integers(1, 4), st.integers(1, 8))
def test_bubble_of_every_schedule_equals_the_checkers_simulation(schedule, pp, m):
    # The cost model's F = B = W = t_stage/3: forward 1, whole backward 2, of which W is 1.
    events = check_schedule(get_schedule(schedule, pp, m), pp, m, forward_time=1, backward_time=2, weight_time=1).events
    simulated = Timeline(events, pp).bubble_fraction()
    slots = bubble_slots(schedule, pp, m)
    assert slots / (m + slots) == pytest.approx(simulated, abs=1e-12)
    layout = Layout(pp=pp, micro_batches=m, schedule=schedule)
    est = estimate(MEDIUM, layout, batch=8 * m, profile=LAPTOP)
    pipelined = est.time["total"] - est.comm["dp"]  # m·t_stage + bubble
    assert est.time["bubble"] / pipelined == pytest.approx(simulated, rel=1e-9)
    assert bubble_slots(schedule, pp, m, recompute=True) == pp - 1  # W runs inside B
