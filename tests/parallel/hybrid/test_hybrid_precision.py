"""The 3D model under a precision policy (minitensor.amp), threads backend.

* An overflow on ONE rank makes every rank skip the step and halve the scale: the found-inf
  flag is MAX-all-reduced over tp, pp and dp, so the scale trajectory is the same everywhere.
* A 16-bit layout equals one device under the same policy to 10 ε of the format, not bit
  for bit: the layout moves where 16-bit rounding happens (parallel/train/check.py).
  AdamW turns a gradient that is rounding noise (zero in exact arithmetic, as the key
  bias's) into a full ±lr step, so after a step two 16-bit runs' weights may differ by
  2·lr: these runs use lr = 1e-4 (LR16) and allow 2·lr per step on the weights.
* fp64 and fp32 policies are the plain run, bit for bit.
* ZeRO-2/3 under a 16-bit policy keep 1/n of the float32 masters in their flat shards and
  gather the 16-bit copies: the same arithmetic as ZeRO-0 under that policy, bit for bit.
* Checkpoints hold the float32 masters and the scaler's state.
"""
import numpy as np
import pytest
from helpers import train_history
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import seeds, zero_layouts

import minitensor as mt
from minitensor import dtypes
from minitensor.amp import MixedPrecision, precision_policy
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import HybridGPT, Mesh, run_threads
from parallel.checkpoint import load_checkpoint, save_checkpoint

CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)
LR, WEIGHT_DECAY = 1e-2, 0.1
LR16 = 1e-4  # the 16-bit equivalence runs: Adam's ±lr on noise stays below the weights' 16-bit spacing
SCALER16 = dict(init_scale=2.0**8)  # low enough that no drawn tiny model overflows in 3 steps
EPS = {"fp16": 2.0**-10, "bf16": 2.0**-7}
needs_bf16 = pytest.mark.skipif(dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: the bfloat16 "
                                "tests did NOT run (pip install -e '.[test]' installs it) !!!")


def batches(count, size=8, seed=0, config=CONFIG, seq=8):
    rng = np.random.default_rng(seed)  # rank-specific rows: each dp rank trains on its own slice
    vocab = config.vocab_size
    return [(rng.integers(0, vocab, (size, seq)), rng.integers(0, vocab, (size, seq))) for _ in range(count)]


def dense(dtype=np.float32, seed=0, config=CONFIG):
    mt.manual_seed(seed)
    return GPT(config, dtype=np.dtype(dtype))


def hybrid(layout, precision, scaler=None, lr=LR, config=CONFIG):
    layout = dict(layout)
    mesh = Mesh(layout.pop("dp"), layout.pop("tp"), layout.pop("pp"))
    model = HybridGPT(dense(np.float64 if precision == "fp64" else np.float32, config=config), mesh,
                      precision=precision, scaler=scaler, **layout)
    model.configure_optimizer(lr=lr, weight_decay=WEIGHT_DECAY)
    return model


# --- every rank skips together --------------------------------------------------------

@pytest.mark.parametrize("where", [(0, 1, 0), (1, 0, 1)], ids=["tp rank 1", "dp rank 1 of pp rank 1"])
def test_an_overflow_on_one_rank_skips_the_step_and_halves_the_scale_on_every_rank(where):
    data = batches(4)

    def run():
        model = hybrid(dict(dp=2, tp=2, pp=2, microbatches=2), "fp16", scaler=dict(init_scale=2.0**10,
                                                                                   growth_interval=2))
        mesh, history = model.mesh, []
        for step, (idx, targets) in enumerate(data):
            model.train_step(idx, targets)
            if step == 2 and (mesh.dp_rank, mesh.tp_rank, mesh.pp_rank) == where:
                next(p for p in model.parameters() if p.grad is not None).grad.flat[0] = np.inf  # this rank only
            before = model.full_state_dict()
            model.optimizer_step()
            after = model.full_state_dict()
            moved = any(not np.array_equal(before[name], after[name]) for name in before)
            history.append((model.amp.scaler.scale, model.amp.skipped, moved))
        return history

    histories = run_threads(8, run, timeout=120)
    # growth_interval 2: 2^10 grows to 2^11 after two clean steps; the overflow at step 2 halves it
    assert histories[0] == [(1024.0, 0, True), (2048.0, 0, True), (1024.0, 1, False), (1024.0, 1, True)]
    assert all(h == histories[0] for h in histories)  # the same trajectory and the same skip on all 8 ranks


# --- equal to one device under the same policy ------------------------------------------

def one_device(precision, data, accumulate, config=CONFIG):
    """Per step: (mean loss, {name: unscaled float32 gradient}, {name: master after the step})."""
    model = dense(config=config)
    amp = MixedPrecision(model.parameters(), precision_policy(precision), **SCALER16)
    optimizer = AdamW(amp.masters, lr=LR16, weight_decay=WEIGHT_DECAY)
    names = [name for name, _ in model.named_parameters()]
    history = []
    for start in range(0, len(data), accumulate):
        losses = []
        for idx, targets in data[start:start + accumulate]:
            _, loss = model(idx, targets)
            amp.backward(loss / accumulate)
            losses.append(loss.item())
        amp.grads_to_master()
        grads = {name: m.grad / amp.scaler.scale for name, m in zip(names, amp.masters)}
        assert amp.step(optimizer)
        amp.zero_grad()
        history.append((float(np.mean(losses)), grads, {name: m.data.copy() for name, m in zip(names, amp.masters)}))
    return history


def relative(got, ref, floor):
    return float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), floor)


def worst_difference(history, ref, eps, floor=None):
    """The largest relative difference of a loss or gradient (a gradient below `floor` (default ε)
    times the largest is rounding noise: measured against that floor), and of the weights after
    step s beyond Adam's 2·lr·s."""
    worst = 0.0
    for step, ((loss, grads, params), (ref_loss, ref_grads, ref_params)) in enumerate(zip(history, ref), 1):
        floor_ = (eps if floor is None else floor) * max(float(np.abs(g).max()) for g in ref_grads.values())
        worst = max(worst, abs(loss - ref_loss) / abs(ref_loss),
                    *(relative(grads[n], ref_grads[n], floor_) for n in ref_grads),
                    *(max(0.0, float(np.abs(params[n] - ref_params[n]).max()) - 2 * LR16 * step)
                      / max(float(np.abs(ref_params[n]).max()), 1e-3) for n in ref_params))
    return worst


@pytest.mark.parametrize("precision, layout, accumulate", [
    ("fp16", dict(dp=2, tp=2, pp=1, microbatches=2), 1),
    ("fp16", dict(dp=2, tp=1, pp=2, microbatches=2, zero=True), 2),
    pytest.param("bf16", dict(dp=1, tp=2, pp=2, microbatches=2, sequence_parallel=True), 1, marks=needs_bf16),
    pytest.param("bf16", dict(dp=2, tp=2, pp=1, microbatches=1), 2, marks=needs_bf16),
    ("fp16", dict(dp=2, tp=1, pp=2, microbatches=2, zero=3), 2),
    pytest.param("bf16", dict(dp=4, tp=1, pp=1, microbatches=2, zero=2), 1, marks=needs_bf16),
])
def test_a_16_bit_layout_equals_one_device_under_the_same_policy(precision, layout, accumulate):
    check_16_bit_layout(precision, layout, accumulate, CONFIG, batches(3 * accumulate))


@settings(max_examples=6, deadline=None)  # each example trains up to 8 threads x 3 steps in 16 bits
@given(drawn=zero_layouts(), precision=st.sampled_from(["fp16"] + (["bf16"] if dtypes.bfloat16 else [])),
       seed=seeds)
def test_any_16_bit_layout_equals_one_device_under_the_same_policy(drawn, precision, seed):
    layout, config = drawn["layout"], GPTConfig(**drawn["config"])
    size = layout["dp"] * layout["microbatches"] * drawn["micro_batch"]
    data = batches(3 * drawn["accumulate"], size, seed % 2**16, config, drawn["seq"])
    # Models as small as d_model 2 and one position: a gradient that is a cancelling sum (pos_emb's)
    # carries the rounding error of the big terms it sums, not of its own size. So here every
    # gradient is measured against the model's largest (floor 1): within 10 ε of it.
    check_16_bit_layout(precision, layout, drawn["accumulate"], config, data, floor=1.0)


def check_16_bit_layout(precision, layout, accumulate, config, data, floor=None):
    def run():
        model = hybrid(layout, precision, scaler=SCALER16, lr=LR16, config=config)
        return train_history(model, data, accumulate)

    world = layout["dp"] * layout["tp"] * layout["pp"]
    histories = run_threads(world, run, timeout=120)
    eps = EPS[precision]
    ref = one_device(precision, data, accumulate, config)
    same_policy = max(worst_difference(h, ref, eps, floor) for h in histories)
    assert same_policy <= 10 * eps  # a few 16-bit roundings moved by the layout
    # The tolerance tells layouts apart: a missing 1/dp (twice the gradient) is far outside it.
    doubled = [(loss, {n: 2 * g for n, g in grads.items()}, params) for loss, grads, params in histories[0]]
    assert worst_difference(doubled, ref, eps, floor) > 100 * eps


@pytest.mark.parametrize("precision", ["fp16", pytest.param("bf16", marks=needs_bf16)])
@pytest.mark.parametrize("base", [dict(dp=2, tp=2, pp=2, microbatches=2), dict(dp=4, tp=1, pp=1, microbatches=1)],
                         ids=["dp2-tp2-pp2", "dp4"])
def test_zero_2_and_3_under_a_16_bit_policy_are_zero_0_bit_for_bit(precision, base):
    # The sharded masters take exactly ZeRO-0's steps: the same 16-bit copies (the rounding of a
    # master chunk gathered = the gather of the rounded chunk), the same float32 sums (the threads
    # backend adds in rank order both ways), AdamW elementwise on the chunks. A master kept in 16
    # bits or a 16-bit reduction would change bits. (One global batch per step: accumulating
    # several, ZeRO-0 adds their gradients in 16 bits, ZeRO-2/3 reduce each and add in float32.)
    data = batches(3)

    def run(zero):
        model = hybrid(dict(base, zero=zero), precision, scaler=SCALER16, lr=LR16)
        history = []
        for idx, targets in data:
            model.train_step(idx, targets)
            history.append(model.full_grads())
            model.optimizer_step()
            history.append(model.full_state_dict())
        return history

    world = base["dp"] * base["tp"] * base["pp"]
    plain = run_threads(world, run, 0, timeout=120)[0]
    for zero in (2, 3):
        sharded = run_threads(world, run, zero, timeout=120)[0]
        for got, ref in zip(sharded, plain):
            for name in ref:
                assert got[name].dtype == np.float32
                np.testing.assert_array_equal(got[name], ref[name], err_msg=f"zero={zero} {name}")


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_uniform_policies_are_the_plain_run_bit_for_bit(precision):
    data = batches(2)
    layout = dict(dp=2, tp=2, pp=1, microbatches=2)

    def run(policy):
        model = hybrid(layout, precision)
        if policy is None:  # the same model without naming a policy
            model = HybridGPT(dense(np.float64 if precision == "fp64" else np.float32), Mesh(2, 2, 1),
                              microbatches=2)
            model.configure_optimizer(lr=LR, weight_decay=WEIGHT_DECAY)
        out = []
        for idx, targets in data:
            model.train_step(idx, targets)
            out.append(model.full_grads())
            model.optimizer_step()
        return out + [model.full_state_dict()]

    named, plain = run_threads(4, run, precision, timeout=120)[0], run_threads(4, run, None, timeout=120)[0]
    for got, ref in zip(named, plain):
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name])


# --- checkpoints --------------------------------------------------------------------------

def test_a_checkpoint_holds_the_float32_masters_and_the_scaler_and_resumes_in_another_layout(tmp_path):
    data = batches(3)

    def train_and_save():
        model = hybrid(dict(dp=1, tp=2, pp=1), "fp16", scaler=dict(init_scale=2.0**12, growth_interval=1))
        for idx, targets in data:
            model.train_step(idx, targets)
            model.optimizer_step()
        save_checkpoint(tmp_path, model, step=3)
        return model.amp.scaler.state_dict(), model.full_state_dict()

    def resume(layout):
        model = hybrid(layout, "fp16", scaler=dict(init_scale=2.0**12, growth_interval=1))
        load_checkpoint(tmp_path, model)
        compute = {name: p.data.copy() for name, p in model.named_parameters()}
        masters = dict(model.named_master_parameters())
        return model.amp.scaler.state_dict(), model.full_state_dict(), compute, masters

    scaler, masters = run_threads(2, train_and_save, timeout=120)[0]
    assert scaler["scale"] == 2.0**15  # three clean steps with growth_interval 1
    assert {v.dtype for v in masters.values()} == {np.dtype(np.float32)}
    for layout, world in ((dict(dp=1, tp=1, pp=2), 2), (dict(dp=1, tp=1, pp=1), 1)):
        for loaded_scaler, loaded, compute, local_masters in run_threads(world, resume, layout, timeout=120):
            assert loaded_scaler == scaler
            for name in masters:  # the masters come back bit for bit, not rounded through float16
                np.testing.assert_array_equal(loaded[name], masters[name])
            for name, p in compute.items():  # and the compute copies are their rounding
                assert p.dtype == np.float16
                np.testing.assert_array_equal(p, local_masters[name].data.astype(np.float16))


def test_a_zero_3_16_bit_checkpoint_resumes_bitwise_and_reshards_to_one_device(tmp_path):
    # The masters live only as chunks: the checkpoint gathers them whole by name (float32), the
    # moments by element range; resumed in the same layout the run continues bit for bit, and
    # one device loads the same float32 masters.
    data = batches(3)
    layout = dict(dp=2, tp=1, pp=1, microbatches=2, zero=3)
    scaler = dict(init_scale=2.0**12, growth_interval=1)

    def train(save_at=None, load=False):
        model = hybrid(layout, "fp16", scaler=scaler)
        first = 2 if load else 0
        if load:
            load_checkpoint(tmp_path, model)
        saved = None
        for step, (idx, targets) in enumerate(data[first:], first):
            if step == save_at:
                save_checkpoint(tmp_path, model, step=step)
                saved = model.full_state_dict()
            model.train_step(idx, targets)
            model.optimizer_step()
        return model.amp.scaler.state_dict(), model.full_state_dict(), saved

    def one_device():
        model = hybrid(dict(dp=1, tp=1, pp=1), "fp16", scaler=scaler)
        load_checkpoint(tmp_path, model)
        return model.full_state_dict(), {name: p.data.copy() for name, p in model.named_parameters()}

    scale, final, saved = run_threads(2, train, 2, timeout=120)[0]
    resumed_scale, resumed, _ = run_threads(2, train, None, True, timeout=120)[0]
    assert resumed_scale == scale and scale["scale"] == 2.0**15  # three clean steps, growth_interval 1
    for name, value in final.items():
        np.testing.assert_array_equal(resumed[name], value)
    masters, compute = one_device()
    for name, value in saved.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(masters[name], value)
        assert compute[name].dtype == np.float16  # and the compute copies are their rounding
        np.testing.assert_array_equal(compute[name], value.astype(np.float16))
