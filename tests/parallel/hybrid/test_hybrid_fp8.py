"""The 3D model under an FP8 recipe (minitensor.fp8), threads backend, float64 around the FP8
products: every layout equals one device under the same recipe to 1e-9 (the amaxes are
MAX-reduced over tp and the replicas, an exact reduction, so every layout casts the same
values with the same scales; current scaling reduces each cast's amax as it casts), the FP8 run differs from the plain one, the tp and dp ranks
agree on every scale, and a checkpoint resumes the amax histories bit for bit."""
import math
from types import SimpleNamespace

import numpy as np
from helpers import train_history
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import seeds, zero_layouts

import minitensor as mt
from minitensor.amp import MixedPrecision, precision_policy
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import HybridGPT, Mesh, run_threads
from parallel.checkpoint import load_checkpoint, save_checkpoint

LR = 1e-2


def batches(count, size, seed, config, seq):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, config.vocab_size, (size, seq)), rng.integers(0, config.vocab_size, (size, seq)))
            for _ in range(count)]


def policy(name, tile):
    if name == "fp64":
        return precision_policy(name)
    recipe = {"fp8-blockwise": {"tile": tile}, "fp8-delayed": {"history": 3}}.get(name, {})
    return precision_policy(name, np.float64, **recipe)


def dense(config):
    mt.manual_seed(0)
    return GPT(config, dtype=np.float64)


def global_microbatches(idx, targets, dp, microbatches):
    """HybridGPT's micro-batch steps over every dp rank (current scaling casts each one whole)."""
    layout = SimpleNamespace(mesh=SimpleNamespace(dp=dp), microbatches=microbatches)
    return HybridGPT.global_microbatches(layout, idx, targets)


def one_device(name, tile, config, data, accumulate, dp=1, microbatches=1):
    """Per step: (mean loss, {name: gradient}, {name: parameter after the step}), each batch in the
    micro-batch steps of a layout with `dp` replicas and `microbatches`."""
    model = dense(config)
    amp = MixedPrecision(model.parameters(), policy(name, tile), model=model)
    optimizer = AdamW(amp.masters, lr=LR, weight_decay=0.01)
    history = []
    for start in range(0, len(data), accumulate):
        losses = []
        for batch in data[start:start + accumulate]:
            for idx, targets in global_microbatches(*batch, dp, microbatches):
                _, loss = model(idx, targets)
                amp.backward(loss / microbatches)  # as HybridGPT: the batches' gradients added, divided after
                losses.append(loss.item())  # (FP8 casts the gradient as it flows: its normalization is the recipe's)
        amp.grads_to_master(divisor=accumulate)
        grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        amp.step(optimizer)
        amp.zero_grad()
        history.append((float(np.mean(losses)), grads, {n: p.data.copy() for n, p in model.named_parameters()}))
    one_device.scales = amp.fp8.state_dict() if amp.fp8 else {}
    return history


def same_histories(scales, ref):
    """A rank's amax histories and scales equal one device's (to float64 rounding: a replica's
    gradient amax is divided by dp·cp, its values were summed in another order)."""
    for name, state in scales.items():
        np.testing.assert_allclose(state["history"], ref[name]["history"], rtol=1e-12)
        np.testing.assert_allclose(state["scale"], ref[name]["scale"], rtol=1e-12)


def parallel_run(name, tile, config, layout, data, accumulate, reduce_amax=True):
    layout = dict(layout)
    mesh_sizes, ep = [layout.pop(axis) for axis in ("dp", "tp", "pp")], layout.pop("ep", 1)

    def run():
        model = HybridGPT(dense(config), Mesh(*mesh_sizes, ep=ep), precision=policy(name, tile), **layout)
        model.configure_optimizer(lr=LR, weight_decay=0.01)
        if not reduce_amax:  # each rank keeps its own amaxes: its scales, and its FP8 numbers, drift apart
            model.amp.fp8.groups = model.amp.fp8.expert_groups = []
        return train_history(model, data, accumulate), model.amp.fp8.state_dict() if model.amp.fp8 else {}

    return run_threads(math.prod(mesh_sizes), run, timeout=120)


def worst(history, ref):
    """The largest relative difference of a loss, a gradient (one that is zero in exact
    arithmetic, the key bias's, is noise below 1e-6 of the largest) or a weight after step s
    beyond 2·lr·s: AdamW turns that noise into ±lr steps of the key bias, which the output
    ignores (softmax is shift-invariant)."""
    out = 0.0
    for step, ((loss, grads, params), (ref_loss, ref_grads, ref_params)) in enumerate(zip(history, ref), 1):
        floor = 1e-6 * max(float(np.abs(g).max()) for g in ref_grads.values())
        out = max(out, abs(loss - ref_loss) / abs(ref_loss),
                  *(float(np.abs(grads[n] - g).max()) / max(float(np.abs(g).max()), floor) for n, g in ref_grads.items()),
                  *(max(0.0, float(np.abs(params[n] - p).max()) - 2 * LR * step) / max(float(np.abs(p).max()), 1e-3)
                    for n, p in ref_params.items()))
    return out


def largest_tile(config, tp, seq):
    """The largest of 4, 2, 1 dividing every size a rank's tiles must not straddle (flag_checks)."""
    sizes = (config.d_model, config.d_model // tp, config.mlp_width // tp, seq)
    return next(t for t in (4, 2, 1) if all(s % t == 0 for s in sizes))


@settings(max_examples=5, deadline=None)  # each example trains up to 8 threads x 3 steps
@given(drawn=zero_layouts(), name=st.sampled_from(["fp8-current", "fp8-delayed", "fp8-blockwise"]), seed=seeds)
def test_any_layout_equals_one_device_under_the_same_fp8_recipe(drawn, name, seed):
    layout, config, accumulate = drawn["layout"], GPTConfig(**drawn["config"]), drawn["accumulate"]
    tile = largest_tile(config, layout["tp"], drawn["seq"])
    size = layout["dp"] * layout["microbatches"] * drawn["micro_batch"]
    data = batches(3 * accumulate, size, seed % 2**16, config, drawn["seq"])
    ref = one_device(name, tile, config, data, accumulate, layout["dp"], layout["microbatches"])
    results = parallel_run(name, tile, config, layout, data, accumulate)
    assert max(worst(history, ref) for history, _ in results) <= 1e-9
    for _, scales in results[1:]:  # the ranks of one pipeline stage hold the same amax histories
        assert scales == results[0][1] or set(scales) != set(results[0][1])
    for _, scales in results:  # and they are one device's: a checkpoint's histories fit any layout
        same_histories(scales, one_device.scales)


def test_the_fp8_recipes_change_the_numbers_and_every_rank_agrees_on_the_scales():
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)
    data = batches(3, 8, 1, config, 8)
    layout = dict(dp=2, tp=2, pp=1, microbatches=2)
    plain = one_device("fp64", 4, config, data, 1)
    for name in ("fp8-current", "fp8-delayed", "fp8-blockwise"):
        ref = one_device(name, 4, config, data, 1, dp=2, microbatches=2)
        assert worst(plain, ref) > 1e-3  # FP8 moved the losses and gradients
        results = parallel_run(name, 4, config, layout, data, 1)
        assert max(worst(history, ref) for history, _ in results) <= 1e-9
        assert all(scales == results[0][1] for _, scales in results)
        assert bool(results[0][1]) == (name == "fp8-delayed")  # current, blockwise scaling carry nothing over


def test_without_the_amax_reduction_the_ranks_scales_differ_and_the_check_fails():
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)
    data = batches(3, 8, 1, config, 8)
    ref = one_device("fp8-delayed", 4, config, data, 1)
    results = parallel_run("fp8-delayed", 4, config, dict(dp=2, tp=2, pp=1, microbatches=1), data, 1,
                           reduce_amax=False)
    assert max(worst(history, ref) for history, _ in results) > 1e-6
    assert any(scales != results[0][1] for _, scales in results)


def test_a_checkpoint_resumes_the_amax_histories_bit_for_bit(tmp_path):
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)
    data = batches(4, 8, 2, config, 8)

    def train(save_after=None, resume=False):
        model = HybridGPT(dense(config), Mesh(2, 1, 2), microbatches=2, precision=policy("fp8-delayed", 4))
        model.configure_optimizer(lr=LR)
        if resume:
            load_checkpoint(tmp_path, model)
        losses = []
        for step, (idx, targets) in enumerate(data[2:] if resume else data, 3 if resume else 1):
            losses.append(model.train_step(idx, targets))
            model.optimizer_step()
            if step == save_after:
                save_checkpoint(tmp_path, model, step=step)
        return losses, model.amp.fp8.state_dict()

    whole = run_threads(4, train, 2, timeout=120)
    resumed = run_threads(4, train, None, True, timeout=120)
    for (losses, scales), (resumed_losses, resumed_scales) in zip(whole, resumed):
        assert resumed_losses == losses[2:] and resumed_scales == scales
