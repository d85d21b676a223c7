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

from minitensor.bench_cli import bench_parser, run_bench, threads_note
from minitensor.bench_timing import timed_calls
from minitensor.flags import AT_LEAST_1
from parallel.bench import collect, report, run_workers, slowest_median, together

CONFIG = dict(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512)
BATCH = 8


def main(argv):
    parser = bench_parser("python -m parallel.bench dp", __doc__, steps=8, warmup=2)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts to run (default 1 2)")
    parser.add_argument("--no-overlap", action="store_true", help="all-reduce after backward, not during it")
    parser.add_argument("--link", help="simulate a network (parallel.comm.link: a name or ALPHA,BETA)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return run_bench(parser, argv, run, {"ranks": AT_LEAST_1})


def run(args):
    if args.worker:
        return run_worker(args.steps, args.warmup, overlap=not args.no_overlap, link=args.link)
    print(f"medium GPT {CONFIG}, batch {BATCH} per rank, float32, AdamW, DataParallel "
          f"(overlap {'off' if args.no_overlap else 'on'}); {threads_note(args)}"
          + (f"; simulated link {args.link}" if args.link else ""))
    flags = (["--no-overlap"] if args.no_overlap else []) + (["--link", args.link] if args.link else [])
    print_table([figures for n in args.ranks for figures in collect(run_workers(n, "dp", args, *flags))])
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

    def batch():
        return rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)

    def step(idx, targets):
        opt.zero_grad()
        dp(idx, targets)[1].backward()
        opt.step()

    step_s = slowest_median(group, timed_calls(step, steps, warmup, before=together(group, batch)))
    if group.rank == 0:
        tokens = group.size * BATCH * CONFIG["block_size"]
        report({"ranks": group.size, "step_s": step_s, "tokens_per_s": tokens / step_s})
    return 0
