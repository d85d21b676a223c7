"""FP8 (minitensor.fp8): the formats against a reference written from their bit fields, the
scaling recipes against loops written from their definitions, the scaled GEMMs against the
dequantized float64 product, the accumulator model, and the FP8 Linear. Comparisons with
PyTorch's float8 casts and torch._scaled_mm run where torch is installed and skip otherwise."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import fp8_gemm_shapes, seeds

import minitensor as mt
from minitensor.amp import MixedPrecision, precision_policy
from minitensor.fp8.formats import E4M3, E5M2, cast, saturate
from minitensor.fp8.gemm import limited_matmul, scaled_matmul
from minitensor.fp8.recipe import BlockwiseScaling, Fp8Recipe
from minitensor.fp8.scaling import (
    DelayedScale,
    block_operand,
    per_tensor,
    quantize_blocks,
    quantize_tiles,
    scale_from_amax,
)
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F

FORMATS = [E4M3, E5M2]


# --- a reference of each format, from its definition ---------------------------------

def code_values(fmt):
    """The values of the positive codes 0, 1, ... in order, as float64 from the bit fields
    (exponent field 0: subnormal m·2^(1−bias−mbits)); NaN/inf codes left out, and one
    more slot past the largest: where a value overflows."""
    values = []
    for code in range(2 ** (fmt.exponent_bits + fmt.mantissa_bits)):
        e, m = code >> fmt.mantissa_bits, code & (2**fmt.mantissa_bits - 1)
        if e == 0:
            value = m * 2.0 ** (1 - fmt.bias - fmt.mantissa_bits)
        else:
            value = (1 + m / 2**fmt.mantissa_bits) * 2.0 ** (e - fmt.bias)
        values.append(value)
        if value == fmt.max:
            ulp = 2.0 ** (e - fmt.bias - fmt.mantissa_bits)
            return np.array(values + [fmt.max + ulp])
    raise AssertionError("the largest value was not reached")


def reference_cast(x, fmt):
    """x rounded to the nearest value of `fmt`, ties to the even code; past the overflow slot's
    rounding range: NaN (e4m3fn) or ±inf (e5m2); ±inf → NaN (e4m3fn) or ±inf. float64 out."""
    values = code_values(fmt)
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    lo = np.clip(np.searchsorted(values, a, side="right") - 1, 0, len(values) - 2)
    hi = lo + 1
    down, up = a - values[lo], values[hi] - a  # exact: the grid's neighbours are within 2× (Sterbenz)
    pick = np.where((up < down) | ((up == down) & (hi % 2 == 0)), hi, lo)
    pick = np.where(a >= values[-1], len(values) - 1, pick)
    out = values[pick]
    overflow = pick == len(values) - 1
    out = np.where(overflow, np.inf if fmt.has_inf else np.nan, out)
    out = np.where(np.isnan(x), np.nan, out)
    return np.copysign(out, x)


def same_bits_or_both_nan(ours, ref):
    ours = np.asarray(ours).astype(np.float64)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan], ref[~nan])
    np.testing.assert_array_equal(np.signbit(ours[~nan]), np.signbit(ref[~nan]))  # −0 is −0


def wide_sample(seed, n=200_000, dtype=np.float32):
    """Random bit patterns of every float32 (half of them), and random values whose exponent
    spans the FP8 range and well past it on both sides (the other half)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[~np.isnan(bits)]  # NaN payloads: NaN is tested once, below, not 2^23 times
    near = rng.uniform(1, 2, n // 2) * 2.0 ** rng.integers(-24, 18, n // 2) * rng.choice([-1, 1], n // 2)
    return np.concatenate([bits.astype(dtype), near.astype(dtype)])


EDGES = np.array([0.0, -0.0, 2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-16, 2.0**-17, 1.5 * 2.0**-17, 2.0**-6, 447.0,
                  448.0, 464.0, 464.03125, 479.9, 480.0, 57344.0, 60000.0, 61440.0, 61441.0, np.inf, -np.inf, np.nan,
                  -448.0, -464.03125, -57344.0, -61440.0, 1e30, -1e-30])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cast_rounds_like_the_formats_definition_over_a_wide_sample_and_the_edges(fmt, dtype):
    x = np.concatenate([wide_sample(0, dtype=dtype), EDGES.astype(dtype)])
    same_bits_or_both_nan(cast(x, fmt), reference_cast(x, fmt))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_saturate_clamps_to_the_largest_value_keeps_nan_and_rounds_the_rest_alike(fmt):
    x = np.concatenate([wide_sample(1), EDGES.astype(np.float32)])
    same_bits_or_both_nan(saturate(x, fmt), reference_cast(np.clip(x.astype(np.float64), -fmt.max, fmt.max), fmt))
    out = saturate(np.array([fmt.max * 1.2, np.inf, -np.inf, np.nan, 1e38], np.float32), fmt).astype(np.float64)
    assert list(out[[0, 1, 2, 4]]) == [fmt.max, fmt.max, -fmt.max, fmt.max] and np.isnan(out[3])


def test_the_edges_of_e4m3fn_and_e5m2():
    e4m3 = cast(np.array([448, 464, 464.03125, 2.0**-10, 3 * 2.0**-10, np.inf], np.float32), E4M3).astype(float)
    assert list(e4m3[:2]) == [448, 448] and np.isnan(e4m3[2]) and np.isnan(e4m3[5])  # 464 ties to even 448
    assert list(e4m3[3:5]) == [0.0, 2 * 2.0**-9]  # half the smallest subnormal ties to 0; 1.5 of it to 2
    e5m2 = cast(np.array([57344, 61440, 61439, -np.inf, 2.0**-17], np.float32), E5M2).astype(float)
    assert list(e5m2) == [57344, np.inf, 57344, -np.inf, 0.0]


def test_pytorch_float8_casts_agree_bit_for_bit():
    torch = pytest.importorskip("torch", reason="torch is not installed (no dependency): the comparison with "
                                                "torch.float8_e4m3fn/e5m2 did not run; the format reference above did")
    x = np.concatenate([wide_sample(2), EDGES.astype(np.float32)])
    for fmt, tdtype in ((E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)):
        ours = cast(x, fmt).astype(np.float64)
        theirs = torch.from_numpy(x).to(tdtype).to(torch.float64).numpy()
        same_bits_or_both_nan(ours, theirs)
        clamped = torch.from_numpy(x).clamp(-fmt.max, fmt.max).to(tdtype).to(torch.float64).numpy()
        same_bits_or_both_nan(saturate(x, fmt).astype(np.float64), clamped)


def test_pytorch_scaled_mm_agrees_with_tensorwise_and_rowwise_scales():
    torch = pytest.importorskip("torch", reason="torch is not installed (no dependency): the comparison with "
                                                "torch._scaled_mm did not run; the float64 references below did")
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(16, 32)).astype(np.float32), rng.normal(size=(8, 32)).astype(np.float32)
    qa, qb = per_tensor(a, 100.0, E4M3), per_tensor(b, 50.0, E4M3)
    ta = torch.from_numpy(qa.q.astype(np.float32)).to(torch.float8_e4m3fn)
    tb = torch.from_numpy(qb.q.astype(np.float32)).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(ta, tb.t(), scale_a=torch.tensor(1 / 100.0), scale_b=torch.tensor(1 / 50.0),
                           out_dtype=torch.float32)
    np.testing.assert_allclose(scaled_matmul(qa, qb, np.float32), out.numpy(), rtol=1e-6)


# --- scales ---------------------------------------------------------------------------

def test_the_scale_maps_the_amax_onto_the_largest_value_with_the_margin_and_keeps_the_old_one_otherwise():
    assert scale_from_amax(3.5, E4M3) == 128.0 and scale_from_amax(3.5, E4M3, margin=2) == 32.0
    assert list(scale_from_amax(np.array([0.0, np.inf, np.nan, 1e-310]), E4M3, previous=7.0)) == [7.0] * 4


def loop_tiles(x, tile, fmt):
    """Tile by tile, written from the definition: the tile's amax, its scale, its cast."""
    q, scales = np.zeros(x.shape), np.zeros((x.shape[0], -(-x.shape[1] // tile)))
    for r in range(x.shape[0]):
        for j, start in enumerate(range(0, x.shape[1], tile)):
            part = x[r, start:start + tile]
            amax = float(np.abs(part).max())
            scales[r, j] = fmt.max / amax if amax > 0 else 1.0
            q[r, start:start + tile] = np.clip(part * x.dtype.type(scales[r, j]), -fmt.max, fmt.max).astype(fmt.dtype)
    return q, scales


@settings(deadline=None)
@given(rows=st.integers(1, 5), k=st.integers(1, 40), tile=st.sampled_from([1, 3, 4, 8, 16]), seed=seeds,
       outlier=st.floats(1, 1e4))
def test_each_tile_takes_the_scale_of_its_own_amax(rows, k, tile, seed, outlier):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    x[rng.integers(rows), rng.integers(k)] *= outlier  # an outlier spends its own tile's range only
    got = quantize_tiles(x, tile, E4M3)
    q, scales = loop_tiles(x, tile, E4M3)
    np.testing.assert_array_equal(got.scale, scales)
    np.testing.assert_array_equal(got.q.astype(np.float64), q)


@settings(deadline=None)
@given(n=st.integers(1, 20), k=st.integers(1, 20), tile=st.sampled_from([1, 2, 4, 8]), seed=seeds)
def test_each_weight_block_takes_the_scale_of_its_own_amax(n, k, tile, seed):
    w = np.random.default_rng(seed).normal(size=(n, k))
    q, scale = quantize_blocks(w, tile, E4M3)
    for i in range(0, n, tile):
        for j in range(0, k, tile):
            block = w[i:i + tile, j:j + tile]
            s = E4M3.max / np.abs(block).max()
            assert scale[i // tile, j // tile] == s
            np.testing.assert_array_equal(q[i:i + tile, j:j + tile].astype(np.float64),
                                          np.clip(block * s, -448, 448).astype(E4M3.dtype).astype(np.float64))


def reference_delayed(amaxes, length, margin, algo, fmt=E4M3):
    """The scale after each step: from the last `length` amaxes (their max or the newest)."""
    scale, out = 1.0, []
    for t in range(len(amaxes)):
        window = amaxes[max(0, t + 1 - length):t + 1]
        amax = max(window) if algo == "max" else window[-1]
        scale = fmt.max / amax / 2**margin if amax > 0 else scale
        out.append(scale)
    return out


@given(amaxes=st.lists(st.just(0.0) | st.floats(1e-6, 1e3), min_size=1, max_size=12), length=st.integers(1, 5),
       margin=st.integers(0, 3), algo=st.sampled_from(["max", "most_recent"]))
def test_delayed_scaling_follows_the_amax_history(amaxes, length, margin, algo):
    scale = DelayedScale(E4M3, length, margin, algo)
    got = []
    for amax in amaxes:
        scale.observe(amax / 2)
        scale.observe(amax)  # two uses in one step: the step's amax is their max
        scale.update()
        got.append(scale.scale)
    np.testing.assert_allclose(got, reference_delayed(amaxes, length, margin, algo), rtol=1e-15)


def test_a_large_amax_leaves_the_history_after_its_length():
    scale = DelayedScale(E4M3, history=2)
    for amax in (448.0, 1.0, 1.0):
        scale.observe(amax)
        scale.update()
    assert scale.scale == 448.0 and list(scale.history) == [1.0, 1.0]


def test_a_recipe_refuses_a_negative_margin_and_a_tile_below_one():
    with pytest.raises(ValueError, match="margin=-1 must be an int ≥ 0"):
        Fp8Recipe("delayed", margin=-1)
    with pytest.raises(ValueError, match="tile=0"):
        Fp8Recipe("blockwise", tile=0)


# --- products ---------------------------------------------------------------------------

@settings(deadline=None)
@given(shape=fp8_gemm_shapes(), seed=seeds)
def test_the_block_scaled_gemm_equals_the_dequantized_float64_product(shape, seed):
    m, n, k, tile = shape
    rng = np.random.default_rng(seed)
    x, w = rng.normal(size=(m, k)) * rng.lognormal(0, 3, (m, 1)), rng.normal(size=(n, k))
    a, b = quantize_tiles(x, tile, E4M3), block_operand(*quantize_blocks(w, tile, E4M3), tile)
    exact = a.dequantize(np.float64) @ b.dequantize(np.float64).T
    np.testing.assert_allclose(scaled_matmul(a, b, np.float64), exact, rtol=1e-12, atol=1e-12 * np.abs(exact).max())


def test_a_tensorwise_gemm_equals_the_dequantized_product_and_is_close_to_the_float_one():
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(8, 64)), rng.normal(size=(16, 64))
    a = per_tensor(x, float(scale_from_amax(np.abs(x).max(), E4M3)), E4M3)
    b = per_tensor(w, float(scale_from_amax(np.abs(w).max(), E4M3)), E4M3)
    np.testing.assert_allclose(scaled_matmul(a, b, np.float64), a.dequantize(np.float64) @ b.dequantize(np.float64).T,
                               rtol=1e-12)
    assert 1e-3 < np.abs(scaled_matmul(a, b, np.float64) - x @ w.T).max() / np.abs(x @ w.T).max() < 0.1


def test_promotion_every_128_keeps_the_limited_accumulator_accurate_for_long_sums():
    rng = np.random.default_rng(5)
    k = 4096
    a = saturate(rng.uniform(0, 1, (2, k)), E4M3).astype(np.float32)
    b = saturate(rng.uniform(0, 1, (2, k)), E4M3).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    plain = np.abs(limited_matmul(a, b, bits=14) - exact).max() / exact.max()
    promoted = np.abs(limited_matmul(a, b, bits=14, promote_every=128) - exact).max() / exact.max()
    assert plain > 1e-3 and promoted < plain / 20
    np.testing.assert_allclose(limited_matmul(a, b, bits=24, promote_every=1), exact, rtol=1e-6)  # float32 itself


# --- the FP8 Linear and the model ----------------------------------------------------------

def test_the_fp8_linear_is_the_plain_linear_when_every_operand_is_exact_in_fp8():
    # values 0 and ±7·2^-j (j = 0..3): any tile's amax is one of them, so its scale 448/amax (and
    # 57344/amax) is a power of two, and every scaled value is 7·2^i, 3 significant bits: exact
    # in e4m3 and e5m2. Nothing rounds, and each product is the plain one.
    rng = np.random.default_rng(6)

    def exact(*shape):
        return rng.choice([0, 1, -1], shape) * 7.0 * 2.0 ** -rng.integers(0, 4, shape)
    for recipe in (Fp8Recipe("current"), Fp8Recipe("blockwise", tile=4)):
        x, w, dy = mt.tensor(exact(6, 8), requires_grad=True), mt.tensor(exact(5, 8), requires_grad=True), exact(6, 5)
        y = F.linear(x, w, fp8=recipe.layer())
        y.backward(dy)
        np.testing.assert_array_equal(y.data, x.data @ w.data.T)
        np.testing.assert_array_equal(x.grad, dy @ w.data)
        np.testing.assert_array_equal(w.grad, dy.T @ x.data)


@pytest.mark.parametrize("scaling", ["current", "delayed", "blockwise"])
def test_the_fp8_linears_products_are_the_dequantized_operands(scaling):
    rng = np.random.default_rng(7)
    x, w, dy = rng.normal(size=(12, 8)), rng.normal(size=(6, 8)), rng.normal(size=(12, 6)) * 1e-3
    layer = Fp8Recipe(scaling, tile=4).layer()
    xt, wt = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)
    F.linear(xt, wt, fp8=layer).backward(dy)
    a, b, saved = layer.forward_operands(x, w)
    deq = lambda pair: pair[0].dequantize(np.float64) @ pair[1].dequantize(np.float64).T
    for got, want in ((xt.grad, deq(layer.dgrad_operands(dy, saved))), (wt.grad, deq(layer.wgrad_operands(dy, saved)))):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    assert not np.allclose(xt.grad, dy @ w, rtol=1e-6)  # the operands were rounded to FP8
    if isinstance(layer, BlockwiseScaling):  # the weight gradient's tiles run along the tokens
        assert layer.wgrad_operands(dy, saved)[0].scale.shape == (6, 3)


def gpt(dtype=np.float64):
    mt.manual_seed(0)
    return GPT(GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=2, d_model=16), dtype=dtype)


def test_the_blocks_linears_run_in_fp8_and_the_embedding_head_and_norms_do_not():
    model = gpt()
    amp = MixedPrecision(model.parameters(), precision_policy("fp8-delayed", np.float64), model=model)
    fp8 = {name for name, m in model.named_modules() if getattr(m, "fp8", None) is not None}
    assert fp8 == set(amp.fp8.layers) == {f"blocks.{i}.{part}" for i in range(2)
                                          for part in ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj")}
    assert model.lm_head.fp8 is None


@pytest.mark.parametrize("name", ["fp8-current", "fp8-delayed", "fp8-blockwise"])
def test_a_gpt_trains_under_each_recipe_close_to_but_not_the_plain_run(name):
    idx = np.random.default_rng(8).integers(0, 12, (4, 8))
    losses = {}
    for policy in ("fp64", name):
        model = gpt()
        amp = MixedPrecision(model.parameters(), precision_policy(policy, np.float64, **(
            {"tile": 8} if policy == "fp8-blockwise" else {})) if policy != "fp64" else precision_policy(policy),
            model=model)
        optimizer = mt.optim.AdamW(amp.masters, lr=1e-2)
        for _ in range(3):
            _, loss = model(idx, idx)
            amp.zero_grad()
            amp.backward(loss)
            amp.grads_to_master()
            amp.step(optimizer)
        losses[policy] = loss.item()
    assert losses[name] != losses["fp64"] and abs(losses[name] - losses["fp64"]) < 0.02 * losses["fp64"]
