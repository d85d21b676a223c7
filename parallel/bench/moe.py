"""Mixture of experts on the addition task: the all-to-all's bytes, the experts' load with and
without the balancing loss, and the cost of experts against the dense model.

    python -m parallel.bench moe [--steps 100] [--experts 4] [--ep 2]

Printed (float32, one BLAS thread's worth of numpy; ranks as threads):

    all-to-all    bytes one rank counted in its ep group in one step of HybridGPT with experts
                  (dp = ep) | parallel.plan.moe.all_to_all_bytes from the rows it sent and
                  received in each MoE layer: they must be equal
    load          tokens per expert over the last 10 steps (all MoE layers, top-1), max/mean: 1.00 is
                  perfect balance, E is one expert taking everything; trained with the balancing
                  loss α = 0 (a router free to collapse) and α = 0.01 (Switch's)
    dense vs MoE  median step time and the final loss (mean of the last 10 steps) of the dense
                  GPT and of the MoE GPT with the same active parameters per token (top-1):
                  E times the MLP parameters for about the dense FLOPs
"""
import functools

import numpy as np

import minitensor as mt
from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import timed_calls
from minitensor.data import AdditionTask
from minitensor.flags import AT_LEAST_1
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh
from parallel.plan.model import dense_param_count
from parallel.plan.moe import active_param_count, all_to_all_bytes

SIZES = dict(n_layer=2, n_head=4, d_model=32)
BATCH, LR = 32, 3e-3


def config(task, experts=0, aux=0.01, top_k=1):
    moe = dict(n_experts=experts, top_k=top_k, aux_loss_coef=aux) if experts else {}
    return GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, **SIZES, **moe)


def train(cfg, task, steps):
    """(median step seconds, mean loss of the last 10 steps, tokens per expert summed over the
    last 10 steps and all MoE layers) on one device."""
    mt.manual_seed(0)
    model = GPT(cfg)
    optimizer = AdamW(model.parameters(), lr=LR)
    rng, losses, loads = np.random.default_rng(0), [], []

    def step(idx, targets):
        model.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # these two records take microseconds of a step's milliseconds
        if cfg.n_experts:
            loads.append(np.concatenate([block.mlp.load for block in model.blocks if hasattr(block.mlp, "load")]))

    # every step is timed (no warm-up): the losses and loads are those of `steps` training steps
    times = timed_calls(step, steps, warmup=0, before=lambda: task.get_batch(BATCH, generator=rng))
    return float(np.median(times)), float(np.mean(losses[-10:])), (np.sum(loads[-10:], axis=0) if loads else None)


def load_balance(load):
    """max/mean of tokens per expert: 1.00 is perfect balance, E one expert taking everything."""
    return load.max() / load.mean()


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
    parser.add_argument("--experts", type=int, default=4, help="experts per MoE block (E)")
    parser.add_argument("--ep", type=int, default=2, help="expert-parallel ranks for the all-to-all count")
    return run_bench(parser, argv, functools.partial(run, parser), {"experts": AT_LEAST_1, "ep": AT_LEAST_1})


def run(parser, args):
    if args.experts % args.ep:
        parser.error(f"--experts {args.experts} is not divisible by --ep {args.ep}")
    task = AdditionTask(digits=2, seed=0)
    counted, formula = all_to_all_step(config(task, args.experts, top_k=2), task, args.ep)
    print(f"all-to-all bytes per step, rank 0 of ep={args.ep}, E={args.experts}, top-2: counted {counted:,} | "
          f"formula {formula:,} ({'equal' if counted == formula else 'DIFFERENT'})")
    print(f"{'model':<28}{'params':>9}{'active':>9}{'step ms':>9}{'loss':>8}{'load max/mean':>15}")
    for name, cfg in (("dense", config(task)), (f"MoE E={args.experts} top-1, α=0", config(task, args.experts, 0.0)),
                      (f"MoE E={args.experts} top-1, α=0.01", config(task, args.experts, 0.01))):
        seconds, loss, load = train(cfg, task, args.steps)
        balance = f"{load_balance(load):.2f}" if cfg.n_experts else "-"
        print(f"{name:<28}{dense_param_count(cfg):>9,}{active_param_count(cfg):>9,}{seconds * 1e3:>9.1f}{loss:>8.3f}"
              f"{balance:>15}", flush=True)
    return 0 if counted == formula else 1
