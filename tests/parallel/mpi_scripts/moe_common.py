"""Shared by the expert-parallel tests (threads and mpiexec): a small MoE GPT trained a few
AdamW steps on one device and under HybridGPT with experts, compared name by name."""
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh

# The attention key bias's gradient is 0 in exact arithmetic (softmax ignores a shift shared by all
# keys): its computed value is rounding noise, so it is measured against 1e-6 of the largest gradient,
# and the bias itself (AdamW moves it by noise / eps, ~1e-14) against PARAM_FLOOR.
NOISE_FLOOR, PARAM_FLOOR = 1e-6, 1e-3


def moe_config(n_experts, top_k, renormalize=True, capacity_factor=None, moe_every=1, expert_groups=1,
               max_groups_per_token=None):
    return GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=8, d_ff=12, n_experts=n_experts,
                     top_k=top_k, renormalize=renormalize, capacity_factor=capacity_factor, moe_every=moe_every,
                     aux_loss_coef=0.1, z_loss_coef=0.01, expert_groups=expert_groups,
                     max_groups_per_token=max_groups_per_token)


def batches(steps, batch=8, seq=8, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 11, (batch, seq)), rng.integers(0, 11, (batch, seq))) for _ in range(steps)]


def single_device(config, data, lr=3e-2):
    """[(loss, {name: grad})] per step and the final parameters, on one device."""
    mt.manual_seed(0)
    model = GPT(config, dtype=np.float64)
    optimizer = AdamW(model.parameters(), lr=lr)
    steps = []
    for idx, targets in data:
        model.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        steps.append((loss.item(), {name: p.grad.copy() for name, p in model.named_parameters()}))
        optimizer.step()
    return steps, {name: p.data.copy() for name, p in model.named_parameters()}


def expert_parallel(config, data, world, dp, ep, microbatches=1, lr=3e-2, tp=1, pp=1, cp=1, **switches):
    """The same as single_device under HybridGPT(Mesh(dp, tp, pp, cp, ep=ep)) on `world`; switches:
    HybridGPT's (schedule, chunks, recompute_activations, zero, ...)."""
    mt.manual_seed(0)
    model = HybridGPT(GPT(config, dtype=np.float64), Mesh(dp, tp, pp, cp, world=world, ep=ep), microbatches,
                      **switches)
    model.configure_optimizer(lr=lr)
    steps = []
    for idx, targets in data:
        loss = model.train_step(idx, targets)
        steps.append((loss, {name: g.copy() for name, g in model.full_grads().items()}))
        model.optimizer_step()
    return steps, model.full_state_dict()


def worst_difference(reference, parallel):
    """The largest relative difference of loss, gradients (per step) and final parameters."""
    (ref_steps, ref_params), (par_steps, par_params) = reference, parallel
    worst = 0.0
    for (ref_loss, ref_grads), (loss, grads) in zip(ref_steps, par_steps, strict=True):
        assert list(grads) == list(ref_grads)
        floor = NOISE_FLOOR * max(np.abs(g).max() for g in ref_grads.values())
        worst = max(worst, abs(loss - ref_loss) / abs(ref_loss),
                    *(np.abs(grads[n] - g).max() / max(np.abs(g).max(), floor) for n, g in ref_grads.items()))
    return max(worst, *(np.abs(par_params[n] - p).max() / max(np.abs(p).max(), PARAM_FLOOR)
                        for n, p in ref_params.items()))
