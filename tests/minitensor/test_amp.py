"""Mixed precision on one device: the policies, the loss scaler, master weights, and the
engine computing in 16 bits (minitensor.amp, minitensor.dtypes).

bfloat16 comes from the optional ml_dtypes package (in the test extra); without it the
bfloat16 tests are skipped with a reason that says so.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import scaler_events

import minitensor as mt
from minitensor import dtypes
from minitensor.amp import GradScaler, MixedPrecision, precision_policy
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW

CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=16)
needs_bf16 = pytest.mark.skipif(dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: the bfloat16 "
                                "tests did NOT run (pip install -e '.[test]' installs it) !!!")
SIXTEEN = [np.float16, pytest.param("bfloat16", marks=needs_bf16)]


def batch(seed=0, size=4):
    rng = np.random.default_rng(seed)
    return rng.integers(0, CONFIG.vocab_size, (size, 8)), rng.integers(0, CONFIG.vocab_size, (size, 8))


def gpt(dtype=np.float32, seed=0):
    mt.manual_seed(seed)
    return GPT(CONFIG, dtype=np.dtype(dtype))


# --- the loss scaler ------------------------------------------------------------------

def test_scaler_backs_off_on_overflow_and_grows_after_growth_interval_clean_steps():
    scaler = GradScaler(init_scale=8.0, growth_interval=3, min_scale=2.0)
    trajectory = []
    for overflow in [False, False, True, False, False, False, True, True, True, False]:
        scaler.update(overflow)
        trajectory.append(scaler.scale)
    # clean steps count from the last change; an overflow halves (never below min_scale) and restarts the count
    assert trajectory == [8, 8, 4, 4, 4, 8, 4, 2, 2, 2]
    assert scaler.growth_tracker == 1


@settings(max_examples=40, deadline=None)
@given(events=scaler_events())
def test_scale_stays_a_power_of_two_between_min_scale_and_its_growth(events):
    init, interval, overflows = events
    scaler = GradScaler(init_scale=2.0**init, growth_interval=interval, min_scale=1.0)
    clean = 0
    for overflow in overflows:
        before = scaler.scale
        scaler.update(overflow)
        clean = 0 if overflow else clean + 1
        assert np.log2(scaler.scale) == int(np.log2(scaler.scale)) and scaler.scale >= 1.0
        if overflow:
            assert scaler.scale == max(before / 2, 1.0)
        else:
            assert scaler.scale == (before * 2 if clean % interval == 0 else before)


def test_scaler_state_round_trips_and_a_disabled_scaler_is_one():
    scaler = GradScaler(init_scale=2.0**10, growth_interval=5)
    for overflow in (True, False, False):
        scaler.update(overflow)
    other = GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict() == {
        "scale": 512.0, "growth_tracker": 2, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 5,
        "min_scale": 1.0, "enabled": True}
    assert GradScaler(enabled=False).scale == 1.0
    with pytest.raises(ValueError, match="the saved scaler is enabled, this one is not"):
        GradScaler(enabled=False).load_state_dict(scaler.state_dict())


@pytest.mark.parametrize("settings_, message", [
    (dict(init_scale=0.0), "init_scale=0.0"), (dict(growth_factor=1.0), "growth_factor=1.0"),
    (dict(backoff_factor=1.5), "backoff_factor=1.5"), (dict(growth_interval=0), "growth_interval=0"),
    (dict(min_scale=2.0**20), "min_scale=1048576.0"),
])
def test_bad_scaler_settings_name_the_value(settings_, message):
    with pytest.raises(ValueError, match=message):
        GradScaler(**settings_)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(-20, 20), seed=st.integers(0, 2**16))
def test_power_of_two_scale_then_unscale_is_bitwise_exact(k, seed):
    # float16 gradients (normal range) cast to float32, times 2^k and back: only the exponent changes
    grads16 = (np.random.default_rng(seed).standard_normal(1000) * 10.0 ** np.random.default_rng(seed).integers(-4, 4))
    grads = grads16.astype(np.float16).astype(np.float32)
    scaled = grads * np.float32(2.0**k)
    scaler = GradScaler(init_scale=2.0**k, min_scale=2.0**k)
    assert not scaler.unscale_([scaled])
    np.testing.assert_array_equal(scaled, grads)


def test_loss_scaling_by_a_power_of_two_gives_the_same_gradient_bits_through_a_whole_gpt():
    # Backward is linear in its seed and every op commutes with 2^k (no overflow, no subnormals in float64).
    idx, targets = batch()
    runs = []
    for scale in (1.0, 2.0**16):
        model = gpt(np.float64)
        amp = MixedPrecision(model.parameters(), precision_policy("fp64"))
        amp.scaler.scale = scale
        _, loss = model(idx, targets)
        amp.backward(loss)
        runs.append([p.grad / scale for p in model.parameters()])
    for unscaled, plain in zip(*runs):
        np.testing.assert_array_equal(unscaled, plain)


def test_an_inf_or_nan_gradient_is_found_and_the_step_skipped():
    model = gpt()
    amp = MixedPrecision(model.parameters(), precision_policy("fp16"))
    optimizer = AdamW(amp.masters, lr=1e-2)
    _, loss = model(*batch())
    amp.backward(loss)
    model.parameters()[3].grad[0] = np.inf
    amp.grads_to_master()
    before = [m.data.copy() for m in amp.masters]
    assert amp.step(optimizer) is False
    assert amp.scaler.scale == 2.0**15 and amp.skipped == 1 and optimizer.state == {}
    assert all(np.array_equal(m.data, b) for m, b in zip(amp.masters, before))


# --- master weights -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", SIXTEEN)
def test_the_model_computes_in_16_bits_and_the_optimizer_steps_float32_masters(dtype):
    model = gpt()
    policy = precision_policy("fp16" if dtype is np.float16 else "bf16")
    amp = MixedPrecision(model.parameters(), policy)
    optimizer = AdamW(amp.masters, lr=1e-2)
    for step in range(2):
        _, loss = model(*batch(step))
        assert loss.dtype == np.float32  # the loss is a sum: returned in float32
        amp.backward(loss)
        assert {p.grad.dtype for p in model.parameters()} == {np.dtype(policy.compute_dtype)}  # no silent upcast
        amp.grads_to_master()
        assert amp.step(optimizer)
        amp.zero_grad()
    assert {m.dtype for m in amp.masters} == {np.dtype(np.float32)}
    assert {v.dtype for s in optimizer.state.values() for v in s.values() if isinstance(v, np.ndarray)} == {
        np.dtype(np.float32)}
    for p, m in zip(model.parameters(), amp.masters):  # each compute copy is its master rounded
        np.testing.assert_array_equal(p.data, m.data.astype(policy.compute_dtype))


def test_updates_too_small_for_float16_accumulate_in_the_master():
    # |Δ| = 1e-5 on weights ~0.5: below float16's spacing there (2^-11), so a float16 weight would not move.
    model = gpt()
    amp = MixedPrecision(model.parameters(), precision_policy("fp16"))
    optimizer = mt.optim.SGD(amp.masters, lr=1e-5)
    w16, w32 = model.ln_f.weight, amp.masters[[id(p) for p in model.parameters()].index(id(model.ln_f.weight))]
    for _ in range(30):
        w16.grad = np.ones_like(w16.data)
        amp.grads_to_master()
        amp.scaler.scale = 1.0
        amp.step(optimizer)
    np.testing.assert_allclose(w32.data, 1.0 - 30e-5, rtol=1e-6)  # the master moved 30 steps
    assert np.all(w16.data == np.float16(1.0 - 30e-5))  # and its rounding is what the model computes with
    assert np.float16(1.0) - np.float16(1e-5) == np.float16(1.0)  # a float16 weight could not have moved


def test_a_policy_needs_the_model_in_its_master_dtype_and_a_known_name():
    with pytest.raises(ValueError, match=r"build the model in float32 \(its master dtype\), got parameters of "
                                         r"\['float64'\]"):
        MixedPrecision(gpt(np.float64).parameters(), precision_policy("fp16"))
    with pytest.raises(ValueError, match="precision 'fp8' is not one of"):
        precision_policy("fp8")


@pytest.mark.parametrize("name", ["fp64", "fp32", "fp16", "bf16", "fp8-delayed"])
def test_every_policy_takes_the_moments_dtype_and_only_fp8_takes_a_recipe(name):
    assert precision_policy(name, moment_dtype="bfloat16").moment_dtype == "bfloat16"
    assert precision_policy(name).moment_dtype is None  # the masters' dtype
    if not name.startswith("fp8-"):  # a recipe's setting given to another policy is refused, not ignored
        with pytest.raises(ValueError, match=rf"precision '{name}' has no FP8 recipe to take \['history'\]"):
            precision_policy(name, history=16)


def test_uniform_policies_change_nothing():
    # fp64: the masters are the parameters, the scaler is off, the same bits as a plain AdamW loop
    idx, targets = batch()
    results = []
    for use_amp in (False, True):
        model = gpt(np.float64)
        amp = MixedPrecision(model.parameters(), precision_policy("fp64")) if use_amp else None
        optimizer = AdamW(model.parameters() if amp is None else amp.masters, lr=1e-2)
        for _ in range(2):
            _, loss = model(idx, targets)
            if amp is None:
                loss.backward()
                optimizer.step()
                model.zero_grad()
            else:
                assert amp.masters is amp.params
                amp.backward(loss)
                amp.grads_to_master()
                amp.step(optimizer)
                amp.zero_grad()
        results.append(model.state_dict())
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name])


# --- the engine in 16 bits ------------------------------------------------------------

def test_without_loss_scaling_small_float16_gradients_flush_to_zero():
    # A loss 1e-4 times smaller: many gradients fall below float16's subnormals (6e-8) and become 0.
    idx, targets = batch()
    zeros = {}
    for scale in (1.0, 2.0**16):
        model = gpt()
        amp = MixedPrecision(model.parameters(), precision_policy("fp16"))
        amp.scaler.scale = scale
        _, loss = model(idx, targets)
        amp.backward(loss * 1e-4)
        zeros[scale] = sum(int((p.grad == 0).sum()) for p in model.parameters())
    reference = gpt(np.float64)
    _, loss = reference(idx, targets)
    (loss * 1e-4).backward()
    exact_zeros = sum(int((p.grad == 0).sum()) for p in reference.parameters())
    assert zeros[1.0] > exact_zeros + 1000  # lost to underflow
    assert zeros[2.0**16] < zeros[1.0] / 4  # scaling keeps most of them


@pytest.mark.parametrize("dtype", SIXTEEN)
def test_sums_add_in_float32(dtype):
    dtype = np.dtype(dtype)
    ones = mt.tensor(np.ones((1000, 4), dtype), requires_grad=True)
    total = ones.sum(axis=0)
    assert total.dtype == dtype and np.all(total.data.astype(np.float32) == 1000)  # bfloat16 adding alone: 256
    row = mt.tensor(np.ones((1, 1000), dtype))
    column = mt.tensor(np.ones((1000, 1), dtype))
    assert (row @ column).item() == 1000 and (row @ column).dtype == dtype


@pytest.mark.parametrize("dtype", SIXTEEN)
def test_a_16_bit_gpt_is_close_to_float64_and_keeps_its_dtype(dtype):
    idx, targets = batch()
    reference = gpt(np.float64)
    _, ref_loss = reference(idx, targets)
    ref_loss.backward()
    model = gpt()
    model.to(np.dtype(dtype))
    logits, loss = model(idx, targets)
    loss.backward()
    eps = 2.0**-10 if np.dtype(dtype) == np.float16 else 2.0**-7
    assert logits.dtype == np.dtype(dtype) and abs(loss.item() - ref_loss.item()) < 10 * eps * ref_loss.item()
    for p, r in zip(model.parameters(), reference.parameters()):
        assert p.grad.dtype == np.dtype(dtype)
        assert np.abs(p.grad.astype(np.float64) - r.grad).max() <= 20 * eps * np.abs(r.grad).max() + 1e-6
