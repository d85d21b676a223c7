"""ZeRO stages 0-3 on the medium GPT: step time, bytes held per rank, bytes communicated.

    python -m parallel.bench zero [--ranks 2 4] [--stages 0 1 2 3] [--steps 4] [--warmup 1]
                                  [--precision fp32 fp16 bf16]

Each rank count runs one mpiexec job (one BLAS thread per rank) that trains a float32
HybridGPT with dp = ranks and each ZeRO stage (0: plain data parallelism) under each
precision policy (default fp32 only; fp16/bf16: 16-bit compute, float32 masters), the
same batch of 8 sequences per rank. Per stage and policy, rank 0 prints:

    step time   the median over steps of the slowest rank's train_step + optimizer_step
    memory      params, grads, optim: bytes held after the gradient sync, measured from
                the live arrays | the formula (`plan.param_bytes_per_rank`, Rajbhandari
                et al. 2020 with K = 2 AdamW states, each unit cut into dp equal chunks);
                gathered: ZeRO-3's peak of all-gathered units | its bound (1 + prefetch)
                of the largest unit
    comm        dp bytes per rank and step, counted by the group | the formula:
                2Ψ(n-1)/n for stages 0-2, 3Ψ(n-1)/n for stage 3 (two all-gathers and a
                reduce-scatter: 1.5x), plus the loss's one-number all-reduce; under a
                16-bit policy the gradients still travel in float32 and ZeRO-2/3's
                all-gathers move the 16-bit copies: Ψ(n-1)/n·(4 + 2) and ·(4 + 2·2)
"""
import argparse

from minitensor.bench_cli import bench_parser, run_bench, threads_note
from minitensor.bench_timing import timed_calls
from minitensor.flags import AT_LEAST_1
from parallel.bench import collect, report, run_workers, slowest_median, together

CONFIG = "medium"
BATCH = 8  # sequences per rank
KINDS = ("params", "grads", "optim", "gathered")


def main(argv):
    parser = bench_parser("python -m parallel.bench zero", __doc__, steps=4, warmup=1)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="dp sizes to run (default 2 4)")
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], choices=(0, 1, 2, 3),
                        help="ZeRO stages (default 0 1 2 3)")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "fp16", "bf16"),
                        help="precision policies (default fp32; fp16/bf16 keep float32 masters)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return run_bench(parser, argv, run, {"ranks": AT_LEAST_1})


def run(args):
    if args.worker:
        return run_worker(args.stages, args.steps, args.warmup, args.precision)
    print(f"{CONFIG} GPT, batch {BATCH} per rank, float32 masters, AdamW, HybridGPT dp = ranks; "
          f"{threads_note(args)}")
    stages = [str(s) for s in args.stages]
    print_table([figures for n in args.ranks for figures in collect(
        run_workers(n, "zero", args, "--stages", *stages, "--precision", *args.precision))])
    return 0


def print_table(results):
    plain = {(r["ranks"], r["precision"]): r["step_s"] for r in results if r["stage"] == 0}
    head = "".join(f"{kind + ' MB':>22}" for kind in KINDS)
    print(f"{'ranks':>5} {'prec':>5} {'stage':>5} {'step s':>7} {'vs DP':>6}{head}{'comm MB/step':>22}")
    print(f"{'':>31}" + f"{'measured | formula':>22}" * (len(KINDS) + 1))
    for r in results:
        dp = plain.get((r["ranks"], r["precision"]))
        ratio = f"{r['step_s'] / dp:>5.2f}x" if dp else f"{'-':>6}"
        cells = "".join(f"{r['measured'][k] / 1e6:>10.3f} | {r['formula'][k] / 1e6:>9.3f}" for k in KINDS)
        comm = f"{r['comm'] / 1e6:>10.3f} | {r['comm_formula'] / 1e6:>9.3f}"
        print(f"{r['ranks']:>5} {r['precision']:>5} {r['stage']:>5} {r['step_s']:>7.3f} {ratio}{cells}{comm}")


def formulas(config, n, stage, precision="fp32"):
    """(bytes held by kind, dp bytes communicated per step) of one rank under a precision policy."""
    from parallel.plan.layout import Layout, get_precision
    from parallel.plan.memory import gathered_unit_bytes, param_bytes_per_rank
    from parallel.plan.model import unit_param_counts

    held = param_bytes_per_rank(config, n, 1, 1, (0, 0, 0), precision, stage)
    held["gathered"] = gathered_unit_bytes(config, Layout(dp=n, zero=stage), 0, precision)
    units = unit_param_counts(config)
    padded = {0: sum(units), 1: -(-sum(units) // n) * n}.get(stage, sum(-(-u // n) * n for u in units))
    sizes = get_precision(precision)
    # the float32 (master) gradients reduced (an all-reduce moves twice), then the all-gathers of the
    # parameters: the masters under ZeRO-1, ZeRO-2/3's compute copies (ZeRO-3 twice: forward and backward)
    gathered = {0: sizes.dp_grad_bytes, 1: sizes.dp_grad_bytes, 2: sizes.param_bytes, 3: 2 * sizes.param_bytes}[stage]
    loss = 2 * (n - 1) * 8 // n  # train_step's all-reduce of the float64 loss
    return held, (sizes.dp_grad_bytes + gathered) * (n - 1) * padded // n + loss


def run_worker(stages, steps, warmup, precisions):
    import dataclasses

    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig
    from parallel.plan.model import get_config

    group = parallel.world()
    config = get_config(CONFIG)
    rng = np.random.default_rng(group.rank)
    shape = (BATCH * group.size, config.block_size)
    for precision, stage in ((p, s) for p in precisions for s in stages):
        mt.manual_seed(0)
        gpt = GPT(GPTConfig(**dataclasses.asdict(config)))
        model = parallel.HybridGPT(gpt, parallel.Mesh(group.size, 1, 1, world=group), zero=stage,
                                   precision=precision, scaler=dict(init_scale=2.0**8))  # fp16: no early skips
        model.configure_optimizer(lr=3e-4)

        def batch():
            model.reset_communication_stats()
            model.reset_memory_peak()
            return (rng.integers(0, config.vocab_size, shape),)

        held = {}

        def step(idx):
            model.train_step(idx, np.roll(idx, -1, axis=1))
            model.finish_grad_sync()
            held.update(model.memory_bytes())
            model.optimizer_step()

        times = timed_calls(step, steps, warmup, before=together(group, batch))
        comm = sum(c["bytes"] for (name, _), c in model.communication_stats().items() if name == "dp")
        step_s = slowest_median(group, times)
        if group.rank == 0:
            held["optim"] = model.memory_bytes()["optim"]  # after a step: the states exist
            memory, comm_formula = formulas(config, group.size, stage, precision)
            report({"ranks": group.size, "precision": precision, "stage": stage, "step_s": step_s, "measured": held,
                    "formula": memory, "comm": comm, "comm_formula": comm_formula})
    return 0
