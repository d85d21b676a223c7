"""Data-parallel training throughput of the medium GPT: 1 rank against 2.

    python -m parallel.bench dp [--ranks 1 2] [--steps 8] [--warmup 2] [--no-overlap] [--link 1gbe]

The model: GPT with d_model 512, 4 layers, 8 heads, block 128, vocab 256, float32,
AdamW, trained through DataParallel (25 MiB buckets, overlap on). Each rank count runs
under mpiexec with ONE BLAS thread per rank and the same per-rank batch (8 sequences),
so n ranks process n times the tokens of one (weak scaling; perfect scaling = n×).

    step time  = median over steps of the slowest rank's forward + backward + step
    tokens/s   = ranks · batch · block / step time
"""
import argparse
import time

from minitensor.flags import AT_LEAST_0, AT_LEAST_1, parse_checked
from parallel.bench import collect, report
from parallel.launch import run_on_mpi_ranks

CONFIG = dict(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512)
BATCH = 8


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m parallel.bench dp", description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts to run (default 1 2)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per rank count (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--no-overlap", action="store_true", help="all-reduce after backward, not during it")
    parser.add_argument("--link", help="simulate a network (parallel.comm.link: a name or ALPHA,BETA)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parse_checked(parser, argv, {"ranks": AT_LEAST_1, "steps": AT_LEAST_1, "warmup": AT_LEAST_0})


def main(argv):
    args = parse(argv)
    if args.worker:
        return run_worker(args.steps, args.warmup, overlap=not args.no_overlap, link=args.link)
    print(f"medium GPT {CONFIG}, batch {BATCH} per rank, float32, AdamW, DataParallel "
          f"(overlap {'off' if args.no_overlap else 'on'}); 1 BLAS thread per rank"
          + (f"; simulated link {args.link}" if args.link else ""))
    results = []
    for n in args.ranks:
        flags = ["--worker", "--steps", args.steps, "--warmup", args.warmup] + (["--no-overlap"] if args.no_overlap else [])
        flags += ["--link", args.link] if args.link else []
        results += collect(run_on_mpi_ranks(n, "parallel.bench", "dp", *flags))
    print_table(results)
    return 0


def print_table(results):
    one = next((r["tokens_per_s"] for r in results if r["ranks"] == 1), None)
    print(f"{'ranks':>5} {'step time':>10} {'tokens/s':>10} {'vs 1 rank':>10}")
    for r in results:
        ratio = f"{r['tokens_per_s'] / one:>9.2f}x" if one else f"{'-':>10}"
        print(f"{r['ranks']:>5} {r['step_s']:>8.3f} s {r['tokens_per_s']:>10.0f} {ratio}")


def run_worker(steps, warmup, overlap, link=None):
    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig
    from minitensor.optim import AdamW
    from parallel.comm.link import with_link

    group = with_link(parallel.world(), link)
    mt.manual_seed(0)
    model = GPT(GPTConfig(**CONFIG))
    dp = parallel.DataParallel(model, group, overlap=overlap)
    opt = AdamW(model.parameters(), lr=3e-4)
    rng = np.random.default_rng(group.rank)
    shape = (BATCH, CONFIG["block_size"])
    times = np.empty(steps)
    for step in range(warmup + steps):
        idx, targets = rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)
        group.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        dp(idx, targets)[1].backward()
        opt.step()
        if step >= warmup:
            times[step - warmup] = time.perf_counter() - start
    group.all_reduce(times, op="max")
    step_s = float(np.median(times))
    if group.rank == 0:
        tokens = group.size * BATCH * CONFIG["block_size"]
        report({"ranks": group.size, "step_s": step_s, "tokens_per_s": tokens / step_s})
    return 0
