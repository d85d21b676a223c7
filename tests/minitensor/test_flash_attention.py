"""Flash attention (minitensor/nn/flash_attention.py) equals the dense attention in float64:
output, log-sum-exp and every gradient to 1e-12, over T, heads, head size, block sizes that do
not divide T, causal on and off, with and without a boolean mask; it saves O(T·d) bytes where
the dense one saves O(T²) (the engine's own byte accounting); bad input is a one-line error."""
import numpy as np
import pytest
from hypothesis import given
from strategies import flash_cases, seeds

import minitensor as mt
from minitensor import graph
from minitensor.models.gpt import GPT, GPTConfig, use_attention
from minitensor.nn import functional as F
from minitensor.nn.attention_kernels import attention_kernel
from minitensor.nn.flash_attention import flash_attention

TOL = 1e-12


def inputs(case, seed):
    """q, k, v (float64 leaves), the output gradient, and a mask (or None) keeping key 0 visible."""
    rng = np.random.default_rng(seed)
    lead = (case["batch"], case["heads"])
    shapes = [lead + (case["t_q"], case["d"]), lead + (case["t_k"], case["d"]), lead + (case["t_k"], case["d"] + 1)]
    q, k, v = (mt.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes)
    grad = rng.standard_normal(lead + (case["t_q"], case["d"] + 1))
    mask = None
    if case["masked"]:  # padding (B, 1, 1, T_k) or a full (B, H, T_q, T_k) mask
        shape = (case["batch"], 1, 1, case["t_k"]) if seed % 2 else lead + (case["t_q"], case["t_k"])
        mask = rng.random(shape) < 0.7
        mask[..., 0] = True
    return q, k, v, grad, mask


def dense_reference(q, k, v, grad, causal, mask):
    """(output, L, dq, dk, dv) of MatMul → Softmax → MatMul, L = log Σ_j e^(s·q·k_j) over visible keys."""
    allowed = np.ones(q.shape[:-1] + k.shape[-2:-1], bool) if mask is None else np.broadcast_to(mask, q.shape[:-1]
                                                                                                  + k.shape[-2:-1])
    if causal:
        allowed = allowed & ~np.triu(np.ones(allowed.shape[-2:], bool), k=1)
    q, k, v = (mt.tensor(t.data, requires_grad=True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mt.tensor(allowed))
    (out * mt.tensor(grad)).sum().backward()
    scores = np.where(allowed, q.data @ k.data.swapaxes(-1, -2) / np.sqrt(q.shape[-1]), -np.inf)
    return out.data, np.logaddexp.reduce(scores, axis=-1), q.grad, k.grad, v.grad


def flash(q, k, v, grad, case, mask):
    out, lse = flash_attention(q, k, v, causal=case["causal"], mask=mask, block_q=case["block_q"],
                               block_k=case["block_k"], return_lse=True)
    (out * mt.tensor(grad)).sum().backward()
    return out.data, lse.data, q.grad, k.grad, v.grad


@given(case=flash_cases(), seed=seeds)
def test_flash_attention_equals_the_dense_attention_output_lse_and_every_gradient(case, seed):
    q, k, v, grad, mask = inputs(case, seed)
    expected = dense_reference(q, k, v, grad, case["causal"], mask)
    got = flash(q, k, v, grad, case, mask)
    for name, g, e in zip(("output", "L", "dq", "dk", "dv"), got, expected):
        np.testing.assert_allclose(g, e, rtol=0, atol=TOL * max(1.0, float(np.abs(e).max())), err_msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_several_key_tiles_per_row_are_needed_and_merged(causal):
    """T = 12 in tiles of 5 and 3 (neither divides it): every row folds up to four key tiles."""
    case = dict(batch=1, heads=2, t_q=12, t_k=12, d=3, block_q=5, block_k=3, causal=causal, masked=False)
    q, k, v, grad, mask = inputs(case, 3)
    for name, g, e in zip(("output", "L", "dq", "dk", "dv"), flash(q, k, v, grad, case, mask),
                          dense_reference(q, k, v, grad, causal, mask)):
        np.testing.assert_allclose(g, e, rtol=0, atol=TOL, err_msg=name)


def test_a_query_that_sees_no_key_gets_zero_output_and_no_gradient():
    case = dict(batch=1, heads=1, t_q=4, t_k=6, d=2, block_q=3, block_k=4, causal=False, masked=True)
    q, k, v, grad, _ = inputs(case, 0)
    mask = np.ones((4, 6), bool)
    mask[2] = False
    out, lse, dq, dk, dv = flash(q, k, v, grad, case, mask)
    assert np.all(out[..., 2, :] == 0) and np.all(np.isneginf(lse[..., 2])) and np.all(dq[..., 2, :] == 0)
    assert np.isfinite(dk).all() and np.isfinite(dv).all()
    keep = [0, 1, 3]
    ref = dense_reference(*(mt.tensor(t.data[..., keep, :], requires_grad=True) if i == 0 else t
                            for i, t in enumerate((q, k, v))), grad[..., keep, :], False, None)
    np.testing.assert_allclose(out[..., keep, :], ref[0], atol=TOL)
    np.testing.assert_allclose(dk, ref[3], atol=TOL)


def saved_bytes(kernel, t, heads=2, d=8):
    rng = np.random.default_rng(0)
    q, k, v = (mt.tensor(rng.standard_normal((1, heads, t, d)), requires_grad=True) for _ in range(3))
    out = (flash_attention(q, k, v, causal=True, block_q=16, block_k=16) if kernel == "flash"
           else F.scaled_dot_product_attention(q, k, v, causal=True))
    return graph.totals(out)["saved_bytes"]


@pytest.mark.parametrize("t", [32, 64, 128])
def test_flash_saves_q_k_v_o_and_l_only_the_dense_kernel_also_the_t_by_t_probabilities(t):
    heads, d = 2, 8
    assert saved_bytes("flash", t, heads, d) == 8 * heads * t * (4 * d + 1)  # Q, K, V, O: T·d each; L: T
    assert saved_bytes("dense", t, heads, d) >= 8 * heads * t * t  # the softmax's (T × T) output
    assert saved_bytes("dense", 2 * t) - saved_bytes("dense", t) > 3 * 8 * 2 * t * t  # grows as T²


def test_float32_stays_float32_and_matches_float64_to_float32_rounding():
    case = dict(batch=1, heads=2, t_q=9, t_k=9, d=4, block_q=4, block_k=2, causal=True, masked=False)
    q, k, v, grad, _ = inputs(case, 1)
    q32, k32, v32 = (mt.tensor(t.data.astype(np.float32), requires_grad=True) for t in (q, k, v))
    out = flash_attention(q32, k32, v32, causal=True, block_q=4, block_k=2)
    (out * mt.tensor(grad.astype(np.float32))).sum().backward()
    assert out.dtype == np.float32 and q32.grad.dtype == np.float32
    ref = dense_reference(q, k, v, grad, True, None)
    np.testing.assert_allclose(out.data, ref[0], atol=1e-5)
    np.testing.assert_allclose(k32.grad, ref[3], atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_q=0), "flash_attention: block_q must be a positive integer, got 0"),
    (dict(block_k=-2), "flash_attention: block_k must be a positive integer, got -2"),
    (dict(block_q=2.5), "flash_attention: block_q must be a positive integer, got 2.5"),
    (dict(k_shape=(1, 2, 6, 3)), r"flash_attention: q \(1, 2, 5, 4\), k \(1, 2, 6, 3\), v \(1, 2, 6, 4\) do not fit"),
    (dict(v_shape=(1, 2, 5, 4)), r"q \(1, 2, 5, 4\), k \(1, 2, 6, 4\), v \(1, 2, 5, 4\) do not fit"),
    (dict(mask=np.ones((5, 5), bool)), r"flash_attention: mask \(5, 5\) does not broadcast to the scores "
                                       r"\(1, 2, 5, 6\)"),
    (dict(mask=np.ones((1, 2, 5, 6))), "flash_attention: mask must be boolean"),
    (dict(v_dtype=mt.float32), "flash_attention: q, k, v have dtypes float64, float64, float32; give them one dtype"),
])
def test_bad_input_is_a_one_line_error(kwargs, message):
    q = mt.zeros(1, 2, 5, 4, dtype=mt.float64)
    k = mt.zeros(*kwargs.pop("k_shape", (1, 2, 6, 4)), dtype=mt.float64)
    v = mt.zeros(*kwargs.pop("v_shape", (1, 2, 6, 4)), dtype=kwargs.pop("v_dtype", mt.float64))
    with pytest.raises(ValueError, match=message) as info:
        flash_attention(q, k, v, **kwargs)
    assert "\n" not in str(info.value)


def test_pytorch_scaled_dot_product_attention_agrees():
    torch = pytest.importorskip("torch", reason="torch is not installed (never required): the dense minitensor "
                                                "attention is the reference here")
    case = dict(batch=2, heads=2, t_q=11, t_k=11, d=4, block_q=4, block_k=3, causal=True, masked=False)
    q, k, v, grad, _ = inputs(case, 5)
    tq, tk, tv = (torch.tensor(t.data, requires_grad=True) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (out * torch.tensor(grad)).sum().backward()
    scores = (tq @ tk.transpose(-1, -2) / 2.0).masked_fill(torch.ones(11, 11, dtype=torch.bool).triu(1), -torch.inf)
    got = flash(q, k, v, grad, case, None)
    for g, e in zip(got, (out, torch.logsumexp(scores, dim=-1), tq.grad, tk.grad, tv.grad)):
        np.testing.assert_allclose(g, e.detach().numpy(), atol=TOL)


def gpt_loss_and_grads(config, kernel, idx, targets):
    mt.manual_seed(0)
    model = use_attention(GPT(config).double(), kernel)
    _, loss = model(idx, targets)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("causal", [True, False])
def test_a_gpt_computing_attention_by_flash_equals_the_dense_gpt(causal):
    config = GPTConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, d_model=8, causal=causal)
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 11, (2, 12)), rng.integers(0, 11, (2, 12))
    loss, grads = gpt_loss_and_grads(config, attention_kernel("flash", block=5), idx, targets)
    ref_loss, ref_grads = gpt_loss_and_grads(config, attention_kernel("dense"), idx, targets)
    assert abs(loss - ref_loss) <= TOL * abs(ref_loss)
    floor = 1e-6 * max(float(np.abs(g).max()) for g in ref_grads.values())  # the key bias's gradient is 0 exactly
    for name, ref in ref_grads.items():
        assert float(np.abs(grads[name] - ref).max()) <= TOL * max(float(np.abs(ref).max()), floor), name


def test_flash_attention_refuses_attention_dropout_and_unknown_kernels():
    model = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, d_model=4, dropout=0.1))
    with pytest.raises(ValueError, match="flash attention has no dropout on its probabilities, but the model's "
                                         "dropout is 0.1; use dropout 0 or the dense kernel"):
        use_attention(model, attention_kernel("flash"))
    with pytest.raises(ValueError, match=r"attention kernel 'sparse' is not one of \('dense', 'flash'\)"):
        attention_kernel("sparse")
    with pytest.raises(ValueError, match="flash attention: block size must be a positive integer, got 0"):
        attention_kernel("flash", block=0)
