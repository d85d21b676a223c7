"""Tensor-parallel training of the medium GPT: tp=1 against tp=2 (and tp=2 with SP).

    python -m parallel.bench tp [--layouts 1 2 2sp] [--steps 5] [--warmup 1]

The model: GPT with d_model 512, 4 layers, 8 heads, block 128, vocab 256, float32,
AdamW, batch 8 (the same batch on every tp rank). Each layout runs under mpiexec with
ONE BLAS thread per rank. Printed per layout:

    step time   median over steps of the slowest rank's forward + backward + grad sync + step
    params      per-rank parameter memory (the dense model holds all of it)
    comm        bytes one rank communicates per step, measured by group.stats(),
                next to the formula below

Communication per rank and step, n = tp, w = 4 bytes, activation A = b·s·h elements.
The cost model is group.stats()': an all-reduce of N elements moves 2(n−1)/n·N·w bytes,
an all-gather or reduce-scatter (N = the whole, gathered array) (n−1)/n·N·w.

  without SP, all-reduces only:
    per layer     2 forward (g after attention and MLP) + 2 backward (f before them) → 4A
    embedding     1 forward (the vocab-parallel lookup's partial sums)                → A
    lm_head       1 backward (f before the column-parallel head)                      → A
    cross-entropy max, then (sum-exp, target logit): 3 numbers per token             → 3bs
    total         2(n−1)/n · w · ((4L + 2)·A + 3bs)
  with SP, each all-reduce of A becomes an all-gather plus a reduce-scatter (same bytes):
    activations   (n−1)/n · w · (8L + 4)·A
    cross-entropy 2(n−1)/n · w · 3bs
    partial grads 2(n−1)/n · w · (6hL + 2h + block·h): per layer 2 LayerNorms (2h each)
                  and 2 row-parallel biases (h each); ln_f (2h); the position table
"""
import argparse

from minitensor.bench_cli import bench_parser, run_bench, threads_note
from minitensor.bench_timing import timed_calls
from parallel.bench import report, run_layouts, slowest_median, together

CONFIG = dict(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512)
BATCH = 8
LAYOUTS = {"1": (1, False), "2": (2, False), "2sp": (2, True)}


def formula_bytes(tp, sequence_parallel, word=4):
    """Bytes one rank communicates per training step (see the module docstring)."""
    b, s, h, n_layer = BATCH, CONFIG["block_size"], CONFIG["d_model"], CONFIG["n_layer"]
    activation = b * s * h
    all_reduce = 2 * (tp - 1) / tp * word
    if not sequence_parallel:
        return all_reduce * ((4 * n_layer + 2) * activation + 3 * b * s)
    gather_or_scatter = (tp - 1) / tp * word
    partial_grads = 6 * h * n_layer + 2 * h + CONFIG["block_size"] * h
    return gather_or_scatter * (8 * n_layer + 4) * activation + all_reduce * (3 * b * s + partial_grads)


def main(argv):
    parser = bench_parser("python -m parallel.bench tp", __doc__, steps=5, warmup=1)
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS),
                        help="tp sizes to run; 2sp = tp 2 with sequence parallelism (default 1 2 2sp)")
    parser.add_argument("--worker", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    return run_bench(parser, argv, run)


def run(args):
    if args.worker:
        return run_worker(*LAYOUTS[args.worker], args.steps, args.warmup)
    print(f"medium GPT {CONFIG}, batch {BATCH}, float32, AdamW; {threads_note(args)}")
    print_table(run_layouts("tp", args.layouts, {layout: LAYOUTS[layout][0] for layout in args.layouts}, args))
    return 0


def print_table(results):
    mib = 2 ** 20
    print(f"{'tp':>3} {'SP':>3} {'step time':>10} {'vs tp=1':>8} {'params/rank':>12} {'dense':>9} "
          f"{'comm/step (measured)':>21} {'(formula)':>11}")
    base = results[0]["step_s"]
    for r in results:
        print(f"{r['tp']:>3} {'on' if r['sp'] else 'off':>3} {r['step_s']:>8.3f} s {base / r['step_s']:>7.2f}x "
              f"{r['param_bytes'] / mib:>8.2f} MiB {r['dense_bytes'] / mib:>5.2f} MiB "
              f"{r['comm_bytes'] / mib:>17.3f} MiB {formula_bytes(r['tp'], r['sp']) / mib:>7.3f} MiB")


def run_worker(tp, sequence_parallel, steps, warmup):
    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig
    from minitensor.optim import AdamW

    group = parallel.world()
    if group.size != tp:
        raise ValueError(f"tp benchmark worker for tp={tp} launched on {group.size} ranks")
    mt.manual_seed(0)
    dense = GPT(GPTConfig(**CONFIG))
    dense_bytes = sum(p.data.nbytes for p in dense.parameters())
    model = parallel.TensorParallelGPT(dense, group, sequence_parallel=sequence_parallel)
    del dense
    opt = AdamW(model.parameters(), lr=3e-4)
    rng = np.random.default_rng(0)  # every tp rank sees the same batch
    shape = (BATCH, CONFIG["block_size"])

    def batch():
        idx, targets = rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)
        group.reset_stats()
        return idx, targets

    def step(idx, targets):
        opt.zero_grad()
        model(idx, targets)[1].backward()
        model.finish_grad_sync()
        opt.step()

    times = timed_calls(step, steps, warmup, before=together(group, batch))
    comm_bytes = sum(counts["bytes"] for counts in group.stats().values())  # the last step's
    step_s = slowest_median(group, times)
    if group.rank == 0:
        report({"tp": tp, "sp": sequence_parallel, "step_s": step_s,
                "param_bytes": sum(p.data.nbytes for p in model.parameters()),
                "dense_bytes": dense_bytes, "comm_bytes": comm_bytes})
    return 0
