"""The planner under an FP8 recipe: the blocks' linear products at the H100's float8 peak
(everything else at float32's), the memory of the float32 policy it keeps, and a device
without FP8 refused."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitensor.models.gpt import GPTConfig
from parallel.plan import Layout, estimate, load_profile
from parallel.plan.flops import stage_flops

CONFIG = GPTConfig(vocab_size=512, block_size=256, n_layer=4, n_head=8, d_model=512)


@settings(deadline=None, max_examples=10)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), recompute=st.booleans(),
       name=st.sampled_from(["fp8-current", "fp8-delayed", "fp8-blockwise"]))
def test_the_linears_run_at_the_float8_peak_and_the_rest_at_float32s(tp, pp, recompute, name):
    h100 = load_profile("h100-80gb")
    layout = Layout(tp=tp, pp=pp, micro_batches=2, recompute=recompute)
    fp8, fp32 = (estimate(CONFIG, layout, 8, h100, dtype=d) for d in (name, "fp32"))
    tokens, passes, layers = 4 * 256, 4 if recompute else 3, CONFIG.n_layer // pp
    linears = passes * 24 * 512**2 * tokens / tp * layers  # q, k, v, proj and the MLP, forward and backward
    rate = h100["efficiency"]
    flops = stage_flops(CONFIG, layers, tokens, tp, recompute, last=True, first_block=CONFIG.n_layer - layers)
    by_hand = (flops - linears) / (67e12 * rate) + linears / (1979e12 * rate)
    assert fp8.time["compute"] == pytest.approx(2 * by_hand, rel=1e-12)  # m = 2 micro-batches, the last stage
    assert fp8.time["compute"] < fp32.time["compute"] / 5
    assert fp8.memory == fp32.memory  # float32 weights, gradients and moments; FP8 copies live per product


def test_a_device_without_fp8_is_refused_by_name():
    with pytest.raises(ValueError, match=r"a100-80gb.*float8"):
        estimate(CONFIG, Layout(), 8, load_profile("a100-80gb"), dtype="fp8-delayed")


def test_the_h100_profile_names_a_source_for_every_peak():
    h100 = load_profile("h100-80gb")
    assert set(h100["peak_flops_sources"]) == set(h100["peak_flops"])
    assert all(source.startswith("datasheet:") for source in h100["peak_flops_sources"].values())


@settings(deadline=None, max_examples=10)
@given(tp=st.sampled_from([1, 2]), k=st.integers(1, 4), shared=st.integers(0, 2), moe_every=st.sampled_from([1, 2]),
       name=st.sampled_from(["fp8-current", "fp8-delayed", "fp8-blockwise"]))
def test_an_moe_blocks_experts_run_at_the_float8_peak_and_its_router_does_not(tp, k, shared, moe_every, name):
    """Each token's k routed and S shared experts, whole on every tp rank, count at the float8 peak in place
    of the MLP; the router (h·E per token) stays at float32's."""
    config = GPTConfig(vocab_size=512, block_size=256, n_layer=4, n_head=8, d_model=512, n_experts=8, top_k=k,
                       shared_experts=shared, expert_hidden=384, moe_every=moe_every)
    h100, layout = load_profile("h100-80gb"), Layout(tp=tp, ep=1, micro_batches=2)
    fp8 = estimate(config, layout, 8, h100, dtype=name)
    tokens, h, moe = 4 * 256, 512, 4 // moe_every
    attention = 8 * h * h * tokens / tp
    linears = 3 * ((4 - moe) * (attention + 16 * h * h * tokens / tp) + moe * (attention + 4 * (k + shared) * h * 384 * tokens))
    flops = stage_flops(config, 4, tokens, tp, False, last=True)
    rate = h100["efficiency"]
    by_hand = (flops - linears) / (67e12 * rate) + linears / (1979e12 * rate)
    assert fp8.time["compute"] == pytest.approx(2 * by_hand, rel=1e-12)


@settings(deadline=None, max_examples=8)
@given(tp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4]), recompute=st.booleans())
def test_fp8_current_pays_one_amax_all_reduce_per_cast_over_tp_and_dp(tp, dp, recompute):
    """Each linear casts x, W and dY twice per micro-batch (x, W again when recomputed), each cast
    an all-reduce of one number over tp and over dp: latency, by hand; delayed scaling pays none."""
    h100 = load_profile("h100-80gb")
    layout = Layout(dp=dp, tp=tp, micro_batches=2, recompute=recompute)
    current, delayed = (estimate(CONFIG, layout, 8, h100, dtype=d) for d in ("fp8-current", "fp8-delayed"))
    alpha, beta = h100["intra"]["alpha_us"] * 1e-6, 1 / (h100["intra"]["bandwidth_gbps"] * 1e9)  # tp·dp ≤ 8: NVLink
    one = sum(2 * (n - 1) * (alpha + 4 / n * beta) for n in (tp, dp))
    by_hand = 2 * CONFIG.n_layer * 6 * (6 if recompute else 4) * one
    assert current.comm.get("fp8 amax", 0.0) == pytest.approx(by_hand, rel=1e-9)
    assert "fp8 amax" not in delayed.comm and current.time["compute"] == delayed.time["compute"]


def test_fp8_current_reduces_a_routed_experts_casts_over_edp_as_the_train_run_counts_them():
    """dp 4, ep 2, 4 experts and 1 shared per block: attention's 4 and the shared expert's 2 linears cast over
    dp, the 2 local experts' 2 each over edp = 2: 48 and 32 all-reduces per step at 2 blocks and one micro-batch,
    what `parallel.train --threads 4 --dp 4 --ep 2 --experts 4 --shared-experts 1 --n-layer 2` counts beyond
    fp8-delayed's (dp 52 against 5 calls, edp 33 against 2, each less delayed's one step reduction)."""
    h100 = load_profile("h100-80gb")
    config = GPTConfig(vocab_size=512, block_size=256, n_layer=2, n_head=8, d_model=512, n_experts=4, top_k=2,
                       shared_experts=1)
    current = estimate(config, Layout(dp=4, ep=2, micro_batches=1), 8, h100, dtype="fp8-current")
    alpha, beta = h100["intra"]["alpha_us"] * 1e-6, 1 / (h100["intra"]["bandwidth_gbps"] * 1e9)
    dp, edp = (2 * (n - 1) * (alpha + 4 / n * beta) for n in (4, 2))
    assert current.comm["fp8 amax"] == pytest.approx(48 * dp + 32 * edp, rel=1e-9)
