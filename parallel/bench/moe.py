"""Mixture of experts on the addition task, variant by variant: step time, loss, MaxVio and the
all-to-all's bytes counted against the formula, beside the dense model.

    python -m parallel.bench moe [--steps 100] [--experts 4] [--ep 2]

Variants (float32; one device for time, loss and MaxVio, with one BLAS thread, as timed_calls
sets it, so dense and MoE compare fairly):

    dense                 the GPT itself
    top-1 α=0 / α=0.01    E experts of the MLP's width, top-1 (the gate is the probability:
                          Switch), without and with the balancing loss
    fine top-2 ...        DeepSeek's routing: 2E experts of half the width, top-2 (the FLOPs of
                          top-1 of E) plus one shared expert of that width, sigmoid scores; balanced by the loss
                          (α=0.01) per sequence or per batch (aux_loss_scope), loss-free (γ=0.01), and
                          loss-free with at most one ep rank per token (M=1)

Columns: parameters and those one token uses; the median step time; the task loss (the
balancing loss taken out), mean of the last 10 steps; MaxVio = (max − mean)/mean tokens per
expert, mean over the MoE layers and the last 10 steps (0: balanced); the bytes rank 0 of
HybridGPT(dp = ep) counted in its ep group in one step | parallel.plan.moe.all_to_all_bytes of
the rows it sent and received: they must be equal (the exit status says whether they are).
"""
import functools

import numpy as np

import minitensor as mt
from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import timed_calls
from minitensor.data import AdditionTask
from minitensor.flags import AT_LEAST_1
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn.moe import MoE
from minitensor.optim import AdamW
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh
from parallel.plan.model import dense_param_count
from parallel.plan.moe import active_param_count, all_to_all_bytes

SIZES = dict(n_layer=2, n_head=4, d_model=32)
BATCH, LR = 32, 3e-3


def config(task, experts=0, **routing):
    moe = dict(n_experts=experts, **routing) if experts else {}
    return GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, **SIZES, **moe)


def variants(task, experts, ep):
    """(name, config) of each variant (the module docstring)."""
    fine = dict(top_k=2, expert_hidden=2 * SIZES["d_model"], shared_experts=1, router_score="sigmoid")
    return [("dense", config(task)),
            ("top-1 α=0", config(task, experts, top_k=1, aux_loss_coef=0.0)),
            ("top-1 α=0.01", config(task, experts, top_k=1, aux_loss_coef=0.01)),
            ("fine top-2 α=0.01", config(task, 2 * experts, **fine, aux_loss_coef=0.01)),
            ("fine top-2 α=0.01 batch", config(task, 2 * experts, **fine, aux_loss_coef=0.01, aux_loss_scope="batch")),
            ("fine top-2 γ=0.01", config(task, 2 * experts, **fine, aux_loss_coef=0.0, expert_bias_rate=0.01)),
            ("fine top-2 γ=0.01 M=1", config(task, 2 * experts, **fine, aux_loss_coef=0.0, expert_bias_rate=0.01,
                                             expert_groups=ep, max_groups_per_token=1))]


def train(cfg, task, steps):
    """(median step seconds, mean task loss of the last 10 steps, mean MaxVio of the last 10 steps
    or None for the dense model) on one device."""
    mt.manual_seed(0)
    model = GPT(cfg)
    optimizer = AdamW(model.parameters(), lr=LR)
    updates = [update for module in model.modules() for update in module.step_updates()]
    rng, losses, violations = np.random.default_rng(0), [], []

    def step(idx, targets):
        model.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()
        for update in updates:  # the loss-free bias, and the step's loads' MaxVio
            update.after_step()
        aux = sum(block.mlp.aux_loss.item() for block in model.blocks if isinstance(block.mlp, MoE))
        losses.append(loss.item() - aux)  # these records take microseconds of a step's milliseconds
        violations.append(np.mean([update.max_violation for update in updates]) if updates else np.nan)

    # every step is timed (no warm-up): the losses and loads are those of `steps` training steps
    times = timed_calls(step, steps, warmup=0, before=lambda: task.get_batch(BATCH, generator=rng))
    vio = float(np.mean(violations[-10:]))
    return float(np.median(times)), float(np.mean(losses[-10:])), None if np.isnan(vio) else vio


def all_to_all_step(cfg, task, ep):
    """(counted, formula) bytes of one step on rank 0 of HybridGPT(Mesh(dp = ep, ep=ep))."""
    idx, targets = task.get_batch(BATCH, generator=np.random.default_rng(1))

    def step():
        mt.manual_seed(0)
        model = HybridGPT(GPT(cfg), Mesh(ep, ep=ep))
        model.reset_communication_stats()
        model.train_step(idx, targets)
        me = model.mesh.ep_rank
        dispatchers = [m.dispatcher for m in model.moe_layers()]
        formula = sum(all_to_all_bytes(d.sent.sum() - d.sent[me], d.received.sum() - d.received[me], cfg.d_model, 4,
                                       cfg.n_experts, ep) for d in dispatchers)
        return model.communication_stats()[("ep", "all_to_all")]["bytes"], formula
    return run_threads(ep, step)[0]


def main(argv=None):
    parser = bench_parser("python -m parallel.bench moe", __doc__, steps=100)
    parser.add_argument("--experts", type=int, default=4, help="experts per MoE block (E; the fine-grained use 2E)")
    parser.add_argument("--ep", type=int, default=2, help="expert-parallel ranks for the all-to-all count")
    return run_bench(parser, argv, functools.partial(run, parser), {"experts": AT_LEAST_1, "ep": AT_LEAST_1})


def run(parser, args):
    if args.experts % args.ep:
        parser.error(f"--experts {args.experts} is not divisible by --ep {args.ep}")
    task = AdditionTask(digits=2, seed=0)
    print(f"E={args.experts}, ep={args.ep}; all-to-all: bytes rank 0 counted in one step | the formula")
    print(f"{'model':<24}{'params':>9}{'active':>9}{'step ms':>9}{'loss':>8}{'MaxVio':>8}   all-to-all")
    equal = True
    for name, cfg in variants(task, args.experts, args.ep):
        seconds, loss, vio = train(cfg, task, args.steps)
        traffic = "-"
        if cfg.n_experts:
            counted, formula = all_to_all_step(cfg, task, args.ep)
            equal &= counted == formula
            traffic = f"{counted:,} | {formula:,} ({'equal' if counted == formula else 'DIFFERENT'})"
        print(f"{name:<24}{dense_param_count(cfg):>9,}{active_param_count(cfg):>9,}{seconds * 1e3:>9.1f}{loss:>8.3f}"
              f"{'-' if vio is None else f'{vio:.2f}':>8}   {traffic}", flush=True)
    return 0 if equal else 1
