"""AdamW with its moments stored in bfloat16 (minitensor.narrow_moments): equal to a numpy
reference written from the AdamW equations with the bf16 store, the plain optimizer in its
limit case (moments in the parameters' dtype), today's dtypes by default, and a loaded state
converted to the setting."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import moment_params

import minitensor as mt
from minitensor.amp import MixedPrecision, precision_policy
from minitensor.optim import AdamW

BF16 = np.dtype(ml_dtypes.bfloat16)
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def reference(p, grads, lr, betas, eps, weight_decay):
    """AdamW (Loshchilov & Hutter, Alg. 2) in float64, the moments rounded to bfloat16 after each
    step's update has read them: (parameter, m, v) after len(grads) steps."""
    (b1, b2), m, v = betas, np.zeros(p.shape, BF16), np.zeros(p.shape, BF16)
    for t, g in enumerate(grads, 1):
        m_wide = b1 * m.astype(np.float64) + (1 - b1) * g
        v_wide = b2 * v.astype(np.float64) + (1 - b2) * g * g
        m_hat, v_hat = m_wide / (1 - b1**t), v_wide / (1 - b2**t)
        p = p * (1 - lr * weight_decay) - lr * m_hat / (np.sqrt(v_hat) + eps)
        m, v = m_wide.astype(BF16), v_wide.astype(BF16)  # ml_dtypes: one rounding to nearest even
    return p, m, v


def stepped(p, grads, **settings):
    param = mt.nn.Parameter(p.copy())
    optimizer = AdamW([param], **HYPER, **settings)
    for g in grads:
        param.grad = g.copy()
        optimizer.step()
    state = optimizer.state[0]
    return param.data, state["exp_avg"], state["exp_avg_sq"]


@settings(max_examples=40, deadline=None)
@given(p=moment_params, seed=st.integers(0, 2**16), steps=st.integers(1, 5), scale=st.sampled_from([1e-6, 1e-2, 1.0, 1e3]))
def test_the_step_equals_the_adamw_equations_with_the_moments_stored_in_bf16(p, seed, steps, scale):
    grads = [np.random.default_rng(seed + t).standard_normal(p.shape) * scale for t in range(steps)]
    param, m, v = stepped(p, grads, moment_dtype="bfloat16")
    ref, ref_m, ref_v = reference(p, grads, **HYPER)
    assert m.dtype == v.dtype == BF16
    np.testing.assert_array_equal(m.view(np.uint16), ref_m.view(np.uint16))  # the stored bits
    np.testing.assert_array_equal(v.view(np.uint16), ref_v.view(np.uint16))
    np.testing.assert_allclose(param, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_moments_in_the_parameters_dtype_are_bitwise_the_plain_optimizer(dtype):
    rng = np.random.default_rng(0)
    p, grads = rng.standard_normal(50).astype(dtype), [rng.standard_normal(50).astype(dtype) for _ in range(4)]
    plain, named = stepped(p, grads), stepped(p, grads, moment_dtype=np.dtype(dtype).name)
    for a, b in zip(plain, named):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_array_equal(a, b)
    narrow = stepped(p, grads, moment_dtype="bfloat16")  # and the setting changes the numbers
    assert np.abs(narrow[0] - plain[0]).max() > 0


def test_by_default_the_moments_are_in_the_masters_dtype():
    """float64 parameters keep float64 moments; a 16-bit policy's optimizer steps float32 masters
    and keeps float32 moments; bfloat16 moments are 2 bytes each."""
    for policy, dtype, moments in (("fp64", np.float64, np.float64), ("bf16", np.float32, np.float32),
                                   ("fp16", np.float32, np.float32)):
        amp = MixedPrecision([mt.nn.Parameter(np.ones(4, dtype))], precision_policy(policy))
        optimizer = AdamW(amp.masters, moment_dtype=amp.policy.moment_dtype)
        amp.masters[0].grad = np.ones(4, np.float32 if policy != "fp64" else np.float64)
        optimizer.step()
        assert {a.dtype for a in optimizer.state_arrays()} == {np.dtype(moments)}
    optimizer = AdamW([mt.nn.Parameter(np.ones(4, np.float32))], moment_dtype="bfloat16")
    optimizer.params[0].grad = np.ones(4, np.float32)
    optimizer.step()
    assert optimizer.state_bytes() == 2 * 4 * 2


@pytest.mark.parametrize("moment_dtype, params, words", [
    ("float16", np.float32, "not one of"), ("float64", np.float32, "wider than the parameters' float32"),
    ("int8", np.float64, "not one of")])
def test_a_moment_dtype_it_cannot_keep_is_refused_by_name(moment_dtype, params, words):
    with pytest.raises(ValueError, match=words):
        AdamW([mt.nn.Parameter(np.ones(2, params))], moment_dtype=moment_dtype)


def test_a_loaded_state_is_converted_to_the_setting():
    """bfloat16 → float32 is exact; float32 → bfloat16 rounds to nearest even (1 + 2⁻⁸, halfway
    between two bfloat16 numbers, goes to the even one: 1)."""
    state = {"defaults": {}, "state": {0: {"step": 3, "exp_avg": np.array([1 + 2**-8, 3.0], np.float32),
                                           "exp_avg_sq": np.array([1 + 3 * 2**-8, 0.5], np.float32)}}}
    narrow = AdamW([mt.nn.Parameter(np.ones(2, np.float32))], moment_dtype="bfloat16")
    narrow.load_state_dict(state)
    assert narrow.state[0]["exp_avg"].dtype == BF16
    assert narrow.state[0]["exp_avg"].astype(np.float32).tolist() == [1.0, 3.0]
    assert narrow.state[0]["exp_avg_sq"].astype(np.float32).tolist() == [1 + 2**-6, 0.5]
    wide = AdamW([mt.nn.Parameter(np.ones(2, np.float32))])
    wide.load_state_dict(narrow.state_dict())
    assert wide.state[0]["exp_avg_sq"].dtype == np.float32
    assert wide.state[0]["exp_avg_sq"].tolist() == [1 + 2**-6, 0.5]
