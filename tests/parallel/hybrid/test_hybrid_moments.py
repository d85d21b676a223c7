"""bfloat16 AdamW moments (minitensor.narrow_moments) in the 3D model, threads backend, float64
masters: every layout and ZeRO stage equals one device with the same moment dtype (the store
rounds each element on its own, so sharding cannot change it), the moments are held in
bfloat16 on every rank, and a checkpoint saves them in bfloat16 and resumes bit for bit, in
its layout or another, or converts them to another moment dtype."""
import math

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from strategies import seeds, zero_layouts

import minitensor as mt
from minitensor.amp import precision_policy
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import HybridGPT, Mesh, run_threads
from parallel.checkpoint import load_checkpoint, save_checkpoint

LR = 1e-2
BF16 = np.dtype(ml_dtypes.bfloat16)
CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)


def policy(moment_dtype):
    return precision_policy("fp64", moment_dtype=moment_dtype)


def batches(count, size, seed, config, seq):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, config.vocab_size, (size, seq)), rng.integers(0, config.vocab_size, (size, seq)))
            for _ in range(count)]


def dense(config):
    mt.manual_seed(0)
    return GPT(config, dtype=np.float64)


def one_device(config, data, accumulate, moment_dtype):
    """The parameters after each step of one device's AdamW with `moment_dtype` moments."""
    model = dense(config)
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=0.01, moment_dtype=moment_dtype)
    history = []
    for start in range(0, len(data), accumulate):
        for idx, targets in data[start:start + accumulate]:
            model(idx, targets)[1].backward()
        for p in model.parameters():
            p.grad /= accumulate
        optimizer.step()
        optimizer.zero_grad()
        history.append({n: p.data.copy() for n, p in model.named_parameters()})
    return history


def parallel_run(config, layout, data, accumulate, moment_dtype="bfloat16"):
    layout = dict(layout)
    mesh_sizes = [layout.pop(axis) for axis in ("dp", "tp", "pp")]

    def run():
        model = HybridGPT(dense(config), Mesh(*mesh_sizes), precision=policy(moment_dtype),
                          **layout)
        model.configure_optimizer(lr=LR, weight_decay=0.01)
        history = []
        for start in range(0, len(data), accumulate):
            for idx, targets in data[start:start + accumulate]:
                model.train_step(idx, targets)
            model.optimizer_step()
            history.append(model.full_state_dict())
        return history, {a.dtype for a in model.optimizer.state_arrays()}

    return run_threads(math.prod(mesh_sizes), run, timeout=120)


def worst(history, ref):
    """The largest relative difference of a weight after step s, beyond 2·lr·s for the attention
    key bias, whose gradient is zero in exact arithmetic: AdamW turns its rounding noise into ±lr
    steps that the output ignores (softmax is shift-invariant)."""
    return max(max(0.0, float(np.abs(params[n] - p).max()) - (2 * LR * step if n.endswith("k.bias") else 0))
               / max(float(np.abs(p).max()), 1e-3)
               for step, (params, ref_params) in enumerate(zip(history, ref), 1) for n, p in ref_params.items())


@settings(max_examples=4, deadline=None)  # each example trains up to 8 threads x 3 steps
@given(drawn=zero_layouts(), seed=seeds)
def test_any_layout_and_zero_stage_equals_one_device_with_bf16_moments(drawn, seed):
    layout, config, accumulate = drawn["layout"], GPTConfig(**drawn["config"]), drawn["accumulate"]
    size = layout["dp"] * layout["microbatches"] * drawn["micro_batch"]
    data = batches(3 * accumulate, size, seed % 2**16, config, drawn["seq"])
    ref = one_device(config, data, accumulate, "bfloat16")
    results = parallel_run(config, layout, data, accumulate)
    assert max(worst(history, ref) for history, _ in results) <= 1e-12
    assert all(dtypes == {BF16} for _, dtypes in results)


def test_bf16_moments_change_the_weights_and_each_zero_stage_matches_its_own_policy():
    data = batches(3, 8, 1, CONFIG, 8)
    narrow, wide = one_device(CONFIG, data, 1, "bfloat16"), one_device(CONFIG, data, 1, None)
    assert worst(narrow, wide) > 1e-6  # the rounded moments moved the weights
    for zero in (0, 1, 2, 3):
        results = parallel_run(CONFIG, dict(dp=2, tp=2, pp=1, microbatches=2, zero=zero), data, 1)
        assert max(worst(history, narrow) for history, _ in results) <= 1e-12
        assert min(worst(history, wide) for history, _ in results) > 1e-6


def train(tmp_path, layout, moment_dtype, data, save_after=None, resume=False):
    """Train on `data` (the last len(data) - 2 batches when resuming from tmp_path); per rank:
    (losses, the whole weights, the moments as a checkpoint saves them)."""
    layout = dict(layout)
    mesh = Mesh(*(layout.pop(axis) for axis in ("dp", "tp", "pp")))
    model = HybridGPT(dense(CONFIG), mesh, precision=policy(moment_dtype), **layout)
    model.configure_optimizer(lr=LR)
    if resume:
        load_checkpoint(tmp_path, model)
    losses = []
    for step, (idx, targets) in enumerate(data[2:] if resume else data, 3 if resume else 1):
        losses.append(model.train_step(idx, targets))
        model.optimizer_step()
        if step == save_after:
            save_checkpoint(tmp_path, model, step=step)
    return losses, model.full_state_dict(), [a.copy() for a in model.optimizer.state_arrays()]


def test_a_checkpoint_keeps_bf16_moments_and_resumes_bit_for_bit_in_its_layout_or_another(tmp_path):
    data = batches(4, 8, 2, CONFIG, 8)
    saving = dict(dp=2, tp=1, pp=2, microbatches=2, zero=1)
    whole = run_threads(4, train, tmp_path, saving, "bfloat16", data, 2, timeout=120)
    saved = np.load(tmp_path / "step_000002" / "rank_00000.npz")
    assert {saved[k].dtype for k in saved.files if k.startswith("exp_avg")} == {np.dtype(np.uint16)}  # bf16 bits
    resumed = run_threads(4, train, tmp_path, saving, "bfloat16", data, None, True, timeout=120)
    for (losses, params, moments), (resumed_losses, resumed_params, resumed_moments) in zip(whole, resumed):
        assert resumed_losses == losses[2:]
        assert all(np.array_equal(params[n], resumed_params[n]) for n in params)
        assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(moments, resumed_moments))
    for layout in (dict(dp=1, tp=2, pp=1, microbatches=1, zero=0), dict(dp=2, tp=2, pp=1, microbatches=1, zero=3)):
        resharded = run_threads(math.prod(layout[a] for a in ("dp", "tp", "pp")), train, tmp_path, layout,
                                "bfloat16", data, None, True, timeout=120)
        for _, params, moments in resharded:  # the same moments, reshaped: the same steps, to float64's sums
            assert {m.dtype for m in moments} == {BF16}
            assert worst([params], [whole[0][1]]) <= 1e-12


def test_resuming_with_another_moment_dtype_converts_the_saved_moments(tmp_path):
    """bfloat16 moments resumed as float64 ones are exact: the next step reads what a resume with
    bfloat16 moments reads, so the weights after it are the same bits (only its store differs);
    float64 ones resumed as bfloat16 are rounded to it."""
    data = batches(3, 8, 2, CONFIG, 8)
    layout = dict(dp=2, tp=1, pp=1, microbatches=1, zero=2)
    run_threads(2, train, tmp_path, layout, "bfloat16", data, 2, timeout=120)
    resumed = run_threads(2, train, tmp_path, layout, None, data, None, True, timeout=120)
    ref = run_threads(2, train, tmp_path, layout, "bfloat16", data, None, True, timeout=120)
    assert {m.dtype for m in resumed[0][2]} == {np.dtype(np.float64)}
    for (_, params, _), (_, ref_params, _) in zip(resumed, ref):  # step 3 read the same moments, unrounded
        assert all(np.array_equal(params[n], ref_params[n]) for n in ref_params)
    back = run_threads(2, train, tmp_path / "wide", layout, None, data, 2, timeout=120)
    narrowed = run_threads(2, train, tmp_path / "wide", layout, "bfloat16", data, None, True, timeout=120)
    assert {m.dtype for m in narrowed[0][2]} == {BF16} and narrowed[0][0] == back[0][0][2:]
