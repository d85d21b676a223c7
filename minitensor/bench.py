"""Benchmark one GPT training step (forward, backward, AdamW) in float32.

    python -m minitensor.bench [--steps N] [--warmup N] [--no-torch]
    python -m minitensor.bench --graph     (the graph rewrites' effect: minitensor.bench_graph)

For a small and a medium config it prints the median ms/step, tokens/s, the
share of the step spent inside matrix products (the `MatMul` and `Linear`
Functions' forward and backward, timed by `matmul_timer`), the model FLOPs
utilisation and the peak memory of a step. If PyTorch is installed it also times
the same architecture in PyTorch eager on the CPU, with torch's thread count set to
numpy's BLAS thread count, and prints the ratio (the median over rounds of each round's
ratio: `paired_ratio`). torch is optional: it is imported
only inside `bench_torch.torch_step`. The process keeps freed memory for reuse
(`minitensor.allocator`) unless `--release-memory` is given.

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
import argparse
import ctypes
import ctypes.util
import statistics
import time
from contextlib import contextmanager

import numpy as np

import minitensor as mt
from minitensor.allocator import keep_freed_memory
from minitensor.bench_torch import torch_step
from minitensor.flags import AT_LEAST_0, AT_LEAST_1, parse_checked
from minitensor.kernel_threads import blas_threads
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F
from minitensor.ops import MatMul
from minitensor.optim import AdamW

CONFIGS = {
    "small": (GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, d_model=128), 16),
    "medium": (GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512), 8),
}


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

    def probe():
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        return time.perf_counter() - start

    return probe


def _status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def peak_step_bytes(step):
    """The largest resident-memory increase over one call of `step`, or None without /proc.

    Freed memory goes back to the OS first (malloc_trim), so the step's arrays must be
    faulted in again and count, whatever the allocator kept from earlier steps."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
        before = _status_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # reset VmHWM (the peak) to the current resident size
        step()
        return 1024 * (_status_kib("VmHWM") - before)
    except (OSError, AttributeError, StopIteration):
        return None


@contextmanager
def matmul_timer():
    """Wrap the forward and backward of the matrix-product Functions with a clock.

    Yields a one-element list holding the seconds spent inside them so far. The
    wrappers exist only inside the `with` block, so an ordinary run pays nothing.
    """
    total = [0.0]
    originals = {}

    def timed(method):
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start
        return wrapper

    for cls in (MatMul, F.Linear):
        for name in ("forward", "backward"):
            originals[cls, name] = cls.__dict__[name]
            setattr(cls, name, timed(originals[cls, name]))
    try:
        yield total
    finally:
        for (cls, name), method in originals.items():
            setattr(cls, name, method)


def random_batch(config, batch, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, config.block_size)
    return rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape)


def minitensor_step(config, batch):
    """A function that runs one training step of a fresh GPT on a fixed random batch."""
    mt.manual_seed(0)
    model = GPT(config)
    return training_step(model, model, *random_batch(config, batch))


def training_step(model, forward, idx, targets):
    """A function that runs one AdamW step of `model`'s parameters, the loss from
    `forward(idx, targets) -> (logits, loss)` (the model itself, or its traced graph)."""
    optimizer = AdamW(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        _, loss = forward(idx, targets)
        loss.backward()
        optimizer.step()

    return step


def time_steps(step, other, steps, warmup, rounds=4, probe=None):
    """Seconds per step of `step` and its seconds inside matmuls, seconds per step of
    `other` (or None), each a list of rounds (a list of steps each), and the seconds of
    `probe()` called once per round (or []).

    The two run in alternating blocks of steps/rounds steps, each block after `warmup`
    untimed steps: a busy machine slows both alike, while within a block each library's
    thread pool is already awake (switching every step would make each wait for the
    other's spinning threads). The two blocks of a round, back to back, feed `paired_ratio`.
    """
    times, matmul, other_times, probes = [], [], [], []
    for r in range(rounds):
        block = steps // rounds + (r < steps % rounds)
        for _ in range(warmup):
            step()
        times.append([])
        matmul.append([])
        for _ in range(block):
            with matmul_timer() as inside:
                start = time.perf_counter()
                step()
                times[-1].append(time.perf_counter() - start)
            matmul[-1].append(inside[0])
        if probe:  # here, not after torch's block: its OpenMP threads spin on after it, sharing the cores
            probes.append(probe())
        if other:
            for _ in range(warmup):
                other()
            other_times.append([])
            for _ in range(block):
                start = time.perf_counter()
                other()
                other_times[-1].append(time.perf_counter() - start)
    return times, matmul, (other_times if other else None), probes


def every_step(rounds):
    """The steps of all rounds, in one list."""
    return [seconds for steps in rounds for seconds in steps]


def paired_ratio(rounds, other_rounds):
    """Median over rounds of (this round's median step / the other's median step in the same
    round). The two blocks of a round ran back to back, so a change of the machine's own
    speed between rounds (±10% over minutes here) divides out, where a ratio of the two
    overall medians would keep it."""
    return statistics.median(statistics.median(mine) / statistics.median(theirs)
                             for mine, theirs in zip(rounds, other_rounds) if mine and theirs)


def mib(nbytes):
    return "-" if nbytes is None else f"{nbytes / 2**20:.0f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per config")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before each block")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--release-memory", action="store_true",
                        help="leave malloc's defaults (freed memory goes back to the OS every step)")
    parser.add_argument("--graph", action="store_true",
                        help="nodes, bytes and step time before -> after the graph rewrites (medium GPT)")
    args = parse_checked(parser, argv, {"steps": AT_LEAST_1, "warmup": AT_LEAST_0})
    kept = not args.release_memory and keep_freed_memory()
    if args.graph:
        from minitensor.bench_graph import graph_main
        return graph_main(args, kept)
    threads = blas_threads()
    probe = gemm_probe()
    probe()  # the first product wakes BLAS's threads
    print(f"float32, numpy {np.__version__}, BLAS threads {threads}, median of {args.steps} steps "
          f"(minitensor and torch in alternating blocks), "
          f"freed memory {'kept (minitensor.allocator)' if kept else 'released to the OS'}")
    rows, gemm = [], []
    for name in args.configs:
        config, batch = CONFIGS[name]
        step = minitensor_step(config, batch)
        other = None if args.no_torch else torch_step(config, *random_batch(config, batch), threads)
        times, matmul, torch_times, probes = time_steps(step, other, args.steps, args.warmup, probe=probe)
        gemm += probes
        peaks = peak_step_bytes(step), (peak_step_bytes(other) if other else None)
        rows.append((name, config, batch, times, matmul, torch_times, peaks))
    rate = 2 * GEMM_SIZE**3 / statistics.median(gemm)
    print(f"GEMM rate: {rate / 1e9:.1f} GFLOP/s (float32 {GEMM_SIZE}³, median of {len(gemm)}, one per round); "
          f"MFU = (6·N·tokens + attention FLOPs) / step time / GEMM rate; peak = largest RSS increase in a step")
    print(f"{'config':<8} {'ms/step':>9} {'tokens/s':>10} {'matmul':>7} {'MFU':>5} {'peak MiB':>9} "
          f"{'torch ms':>9} {'ratio':>6} {'torch MFU':>9} {'torch MiB':>9}")
    for name, config, batch, rounds, matmul, torch_rounds, (peak, torch_peak) in rows:
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
        print(f"{name:<8} {ms:9.1f} {tokens:10.0f} {share:6.0%} {flops / (ms / 1e3) / rate:5.0%} "
              f"{mib(peak):>9} {tail}")


if __name__ == "__main__":
    main()
