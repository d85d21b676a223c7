"""Benchmark one GPT training step (forward, backward, AdamW) in float32.

    python -m minitensor.bench [--steps N] [--warmup N] [--blas-threads N] [--no-torch] [--configs small medium tiny]
    python -m minitensor.bench --graph     (the graph rewrites' effect: minitensor.bench_graph)
    python -m minitensor.bench --attention (flash attention's step and saved bytes vs the dense kernel's:
                                            minitensor.bench_attention; --lengths, --block, --budget, --beyond)

`--configs tiny` runs the small GPT's ops at d_model 8 on 4 tokens, where their arithmetic
vanishes: its ms/step is a step's fixed cost (the Python of 52 graph nodes and their Module
calls, numpy's per-call overhead), and its ratio to the numpy limit is what the engine's
graph costs per step beyond a hand-written program's.

For a small and a medium config it prints the median ms/step, tokens/s, the
share of the step spent inside matrix products (the `MatMul` and `Linear`
Functions' forward and backward, timed by `bench_timing.matmul_timer`), the model FLOPs
utilisation and the peak memory of a step. Beside it, the numpy limit: the same step
written by hand in numpy with no autograd (`bench_numpy`), and the engine's ratio to it,
what its graph and Tensor objects cost. If PyTorch is installed it also times the same
architecture in PyTorch eager on the CPU, with torch's thread count set to numpy's BLAS
thread count: one unless `--blas-threads N` (the flags every benchmark shares,
`bench_cli`). The engine and the numpy limit alternate step by step: their ratio is the
median over pairs of adjacent steps (`pair_ratios`), beside the middle half of those pair
ratios (their spread); torch runs in blocks and its ratio is the median over rounds of each
round's ratio (`paired_ratio`). torch is optional: it is imported only inside `bench_torch.torch_step`.
The process keeps freed memory for reuse (`minitensor.allocator`) unless
`--release-memory` is given.

MFU (model FLOPs utilisation) = model FLOPs per step / step time / the GEMM rate,
where model FLOPs = 6·N·tokens (forward 2·N, backward 4·N per token; N the parameters
of the matrix products, i.e. all but the embedding tables) + 12·n_layer·d_model·T per
token for attention's two products (PaLM's count), and the GEMM rate is this machine's
float32 rate on one 1024³ product, timed in each round of the alternation (so a busy
machine slows it alike) and printed in the header.

Peak memory: the largest increase of the process's resident memory over one step
(Linux's VmHWM, reset before the step, after handing freed memory back to the OS), the
same measure for both libraries; "-" where /proc is not there.
"""
import statistics

import numpy as np

import minitensor as mt
from minitensor.allocator import keep_freed_memory
from minitensor.bench_attention import attention_main
from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_graph import graph_main
from minitensor.bench_numpy import numpy_step
from minitensor.bench_timing import (
    CONFIGS,
    DEFAULT_CONFIGS,
    every_step,
    mib,
    pair_ratios,
    paired_ratio,
    peak_step_bytes,
    quartiles,
    random_batch,
    seconds_of,
    time_steps,
    training_step,
)
from minitensor.bench_torch import torch_step
from minitensor.flags import AT_LEAST_1
from minitensor.kernel_threads import blas_threads
from minitensor.models.gpt import GPT

GEMM_SIZE = 1024


def model_flops(config, batch):
    """FLOPs of one training step: 6·N·tokens + attention's 12·n_layer·d_model·T per token."""
    mt.manual_seed(0)
    n = sum(p.size for name, p in GPT(config).named_parameters() if not name.endswith("_emb.weight"))
    tokens = batch * config.block_size
    return 6 * n * tokens + 12 * config.n_layer * config.d_model * config.block_size * tokens


def gemm_probe():
    """A function that times one float32 GEMM_SIZE³ product and returns its seconds."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((GEMM_SIZE, GEMM_SIZE)).astype(np.float32) for _ in range(2))
    out = np.empty_like(a)

    return lambda: seconds_of(np.matmul, a, b, out)


def minitensor_step(config, batch):
    """A function that runs one training step of a fresh GPT on a fixed random batch."""
    mt.manual_seed(0)
    model = GPT(config)
    return training_step(model, model, *random_batch(config, batch))


def numpy_limit_step(config, batch):
    """The same step, from the same weights, written by hand in numpy (bench_numpy)."""
    mt.manual_seed(0)
    return numpy_step(config, GPT(config).state_dict(), *random_batch(config, batch))


def main(argv=None):
    parser = bench_parser(None, __doc__, steps=20, warmup=1)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=list(CONFIGS),
                        help="tiny: the small GPT's ops with almost no arithmetic, each step's fixed cost")
    parser.add_argument("--release-memory", action="store_true",
                        help="leave malloc's defaults (freed memory goes back to the OS every step)")
    parser.add_argument("--graph", action="store_true",
                        help="nodes, bytes and step time before -> after the graph rewrites (medium GPT)")
    attention = parser.add_argument_group("--attention (minitensor.bench_attention)")
    attention.add_argument("--attention", action="store_true", help="flash vs dense attention: step time, saved bytes")
    attention.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], metavar="T",
                           help="sequence lengths (default 1024 2048)")
    attention.add_argument("--heads", type=int, default=4, help="heads (default 4)")
    attention.add_argument("--head-size", type=int, default=64, help="head size d (default 64)")
    attention.add_argument("--block", type=int, default=128, help="flash attention's tile, queries and keys (default 128)")
    attention.add_argument("--bidirectional", action="store_true", help="no causal mask: flash skips no tile")
    attention.add_argument("--budget", type=int, default=512, metavar="MIB",
                           help="memory budget for saved activations (default 512 MiB)")
    attention.add_argument("--beyond", type=int, default=8192, metavar="T",
                           help="a length whose dense probabilities exceed the budget (default 8192)")
    return run_bench(parser, argv, run, rules={name: AT_LEAST_1 for name in (
        "heads", "head_size", "block", "budget", "beyond")})


def run(args):
    kept = not args.release_memory and keep_freed_memory()
    if args.graph:
        return graph_main(args, kept)
    if args.attention:
        return attention_main(args)
    threads = blas_threads()
    probe = gemm_probe()
    probe()  # the first product wakes BLAS's threads
    print(f"float32, numpy {np.__version__}, BLAS threads {threads}, median of {args.steps} steps "
          f"(minitensor and the numpy limit alternating step by step, torch in blocks), "
          f"freed memory {'kept (minitensor.allocator)' if kept else 'released to the OS'}")
    rows, gemm = [], []
    for name in args.configs:
        config, batch = CONFIGS[name]
        step = minitensor_step(config, batch)
        other = None if args.no_torch else torch_step(config, *random_batch(config, batch), threads)
        times, matmul, numpy_times, (torch_times,), probes = time_steps(
            step, args.steps, args.warmup, partner=numpy_limit_step(config, batch), others=[other], probe=probe)
        gemm += probes
        peaks = peak_step_bytes(step), (peak_step_bytes(other) if other else None)
        rows.append((name, config, batch, times, matmul, numpy_times, torch_times, peaks))
    rate = 2 * GEMM_SIZE**3 / statistics.median(gemm)
    print(f"GEMM rate: {rate / 1e9:.1f} GFLOP/s (float32 {GEMM_SIZE}³, median of {len(gemm)}, one per round); "
          f"MFU = (6·N·tokens + attention FLOPs) / step time / GEMM rate; peak = largest RSS increase in a step")
    print(f"{'config':<8} {'ms/step':>9} {'tokens/s':>10} {'matmul':>7} {'MFU':>5} {'peak MiB':>9} "
          f"{'numpy ms':>9} {'ratio':>6} {'spread':>11} {'torch ms':>9} {'ratio':>6} {'torch MFU':>9} {'torch MiB':>9}")
    for name, config, batch, rounds, matmul, numpy_rounds, torch_rounds, (peak, torch_peak) in rows:
        times = every_step(rounds)
        ms = 1e3 * statistics.median(times)
        share = statistics.median(m / t for m, t in zip(every_step(matmul), times))
        tokens = batch * config.block_size / (ms / 1e3)
        flops = model_flops(config, batch)
        if torch_rounds is None:
            tail = f"{'-':>9} {'-':>6} {'-':>9} {'-':>9}"
        else:
            torch_ms = 1e3 * statistics.median(every_step(torch_rounds))
            tail = (f"{torch_ms:9.1f} {paired_ratio(rounds, torch_rounds):5.2f}x "
                    f"{flops / (torch_ms / 1e3) / rate:9.0%} "
                    f"{mib(torch_peak):>9}")
        numpy_ms = 1e3 * statistics.median(every_step(numpy_rounds))
        ratios = pair_ratios(rounds, numpy_rounds)
        middle = "{:.2f}-{:.2f}".format(*quartiles(ratios))
        print(f"{name:<8} {ms:9.1f} {tokens:10.0f} {share:6.0%} {flops / (ms / 1e3) / rate:5.0%} "
              f"{mib(peak):>9} {numpy_ms:9.1f} {statistics.median(ratios):5.2f}x {middle:>11} {tail}")


if __name__ == "__main__":
    main()
