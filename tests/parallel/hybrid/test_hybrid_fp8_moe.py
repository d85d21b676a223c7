"""A mixture of experts under an FP8 recipe, threads backend, float64 around the FP8 products:
the routed and shared experts' linears run in FP8 and the router does not; every dp × ep
layout (any ZeRO stage) equals one device under the same recipe to 1e-9, and each expert's
amax history is one device's (its replicas over edp took the MAX); without that reduction
the experts' scales drift apart; the per-token weight-gradient tiles of a routed expert do
not depend on how its rows are grouped, the tiles along the tokens do; an expert that gets
no tokens keeps finite scales."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import seeds
from test_hybrid_fp8 import batches, dense, one_device, parallel_run, same_histories, worst

from minitensor.fp8.gemm import scaled_matmul
from minitensor.fp8.recipe import Fp8Recipe
from minitensor.models.gpt import GPTConfig

TILE = 4  # divides d_model, the expert widths and the sequence: no tile straddles two ranks' parts


def moe_config(n_experts, top_k, shared):
    return GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=8, n_experts=n_experts, top_k=top_k,
                     shared_experts=shared, expert_hidden=8, aux_loss_coef=0.1)


@st.composite
def fp8_moe_layouts(draw):
    """dp × ep of at most 4 ranks (ep < dp sometimes: experts with replicas over edp), a ZeRO stage, a recipe."""
    dp = draw(st.sampled_from([2, 4]))
    ep = draw(st.sampled_from([1, 2] if dp == 2 else [2, 4]))
    n_experts = ep * draw(st.integers(1, 2))
    return dict(layout=dict(dp=dp, tp=1, pp=1, ep=ep, microbatches=1, zero=draw(st.sampled_from([0, 1, 2, 3]))),
                config=moe_config(n_experts, draw(st.integers(1, min(2, n_experts))), draw(st.sampled_from([0, 1]))),
                name=draw(st.sampled_from(["fp8-delayed", "fp8-blockwise"])))


@settings(max_examples=4, deadline=None)  # each example trains up to 4 threads x 3 steps
@given(drawn=fp8_moe_layouts(), seed=seeds)
def test_experts_in_any_layout_equal_one_device_under_the_same_fp8_recipe(drawn, seed):
    layout, config, name = drawn["layout"], drawn["config"], drawn["name"]
    data = batches(3, 2 * layout["dp"], seed % 2**16, config, 8)
    ref = one_device(name, TILE, config, data, 1)
    results = parallel_run(name, TILE, config, layout, data, 1)
    assert max(worst(history, ref) for history, _ in results) <= 1e-9
    for _, scales in results:  # every rank's expert histories (edp-reduced) are one device's
        same_histories(scales, one_device.scales)


def test_the_experts_run_in_fp8_and_the_router_does_not():
    model = dense(moe_config(4, 2, 1))
    one_device("fp8-delayed", TILE, model.config, batches(1, 2, 0, model.config, 8), 1)
    scales = one_device.scales
    assert {"blocks.0.mlp.experts.3.fc.x", "blocks.1.mlp.shared.proj.dy", "blocks.1.attn.q.w"} <= set(scales)
    assert not any("router" in key for key in scales)  # a rounding that swaps a top-k choice runs another expert


def test_without_the_edp_amax_reduction_the_expert_scales_differ_and_the_check_fails():
    config = moe_config(2, 1, 0)
    data = batches(3, 8, 3, config, 8)
    ref = one_device("fp8-delayed", TILE, config, data, 1)
    layout = dict(dp=4, tp=1, pp=1, ep=2, microbatches=1)
    assert max(worst(history, ref) for history, _ in parallel_run("fp8-delayed", TILE, config, layout, data, 1)) <= 1e-9
    results = parallel_run("fp8-delayed", TILE, config, layout, data, 1, reduce_amax=False)
    assert max(worst(history, ref) for history, _ in results) > 1e-6
    expert = [{k: v for k, v in scales.items() if ".experts.0." in k} for _, scales in results]
    assert expert[0] != expert[2]  # ranks 0 and 2 hold expert 0's replicas (edp), each saw its own tokens


def wgrad(layer, x, dy):
    """dW = dYᵀ x through `layer`'s FP8 operands."""
    _, _, saved = layer.forward_operands(x, np.ones((dy.shape[1], x.shape[1])))
    return scaled_matmul(*layer.wgrad_operands(dy, saved), np.float64)


@given(seed=seeds, split=st.integers(1, 11))
def test_per_token_wgrad_tiles_do_not_depend_on_how_the_rows_are_grouped(seed, split):
    """A routed expert's rows arrive grouped by the layout: its wgrad summed over two groups of rows
    (two replicas) is its wgrad of all rows, with per-token tiles; with tiles along the tokens a
    tile holds other rows, and the quantization differs (an outlier row spends its tile's range)."""
    rng = np.random.default_rng(seed)
    x, dy = rng.normal(size=(12, 8)), rng.normal(size=(12, 4))
    x[0] *= 1e3  # an outlier token: its tile's others lose precision
    per_token, along_tokens = (Fp8Recipe("blockwise", tile=4).layer(rows_in_any_order=flag) for flag in (True, False))
    whole = wgrad(per_token, x, dy)
    parts = wgrad(per_token, x[:split], dy[:split]) + wgrad(per_token, x[split:], dy[split:])
    np.testing.assert_allclose(parts, whole, rtol=1e-12, atol=1e-12 * np.abs(whole).max())
    order = rng.permutation(12)
    assert not np.allclose(wgrad(along_tokens, x[order], dy[order]), wgrad(along_tokens, x, dy), rtol=1e-9)


@given(scaling=st.sampled_from(["delayed", "blockwise"]))
def test_an_expert_with_no_tokens_keeps_finite_scales(scaling):
    layer = Fp8Recipe(scaling, tile=4).layer(rows_in_any_order=True)
    x, w, dy = np.zeros((0, 8)), np.ones((4, 8)), np.zeros((0, 4))
    a, b, saved = layer.forward_operands(x, w)
    assert scaled_matmul(a, b, np.float64).shape == (0, 4)
    assert scaled_matmul(*layer.dgrad_operands(dy, saved), np.float64).shape == (0, 8)
    assert not scaled_matmul(*layer.wgrad_operands(dy, saved), np.float64).any()
    for role, scale in layer.delayed_scales().items():
        scale.update()  # x's and dY's amax is 0 this step: the previous scale stays (W's is its own)
        assert scale.scale == (448.0 if role == "w" else 1.0) and np.isfinite(scale.history).all()
