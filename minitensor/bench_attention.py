"""`python -m minitensor.bench --attention`: flash attention's step against the dense one.

One step is causal attention's (or with --bidirectional, unmasked attention's) forward and backward on (1, heads, T, d) float32 tensors, q, k
and v leaves: the dense kernel (MatMul → Softmax → MatMul, keeping the (T × T) probabilities)
and the tiled one (minitensor/nn/flash_attention.py, keeping O and L) alternate step by step,
and their ratio is the median over adjacent pairs (bench_timing.pair_ratios), beside the middle
half of those ratios. Each kernel's bytes saved for backward are the engine's own count
(minitensor.graph.totals), so the table shows what each keeps as well as what it costs.

Then the memory budget: at --beyond T the dense kernel's saved probabilities alone exceed
--budget MiB, so it is not run; the tiled kernel runs one step there and its saved bytes and
time are printed.
"""
import statistics

import numpy as np

import minitensor as mt
from minitensor import graph
from minitensor.bench_timing import every_step, pair_ratios, quartiles, seconds_of, time_steps
from minitensor.nn import functional as F
from minitensor.nn.flash_attention import flash_attention


def leaves(heads, t, d, seed=0):
    rng = np.random.default_rng(seed)
    return [mt.tensor(rng.standard_normal((1, heads, t, d)).astype(np.float32), requires_grad=True)
            for _ in range(3)]


def attention(kernel, q, k, v, block, causal=True):
    if kernel == "flash":
        return flash_attention(q, k, v, causal=causal, block_q=block, block_k=block)
    return F.scaled_dot_product_attention(q, k, v, causal=causal)


def saved_bytes(kernel, heads, t, d, block):
    """The bytes the kernel's graph keeps for backward, by the engine's count."""
    return graph.totals(attention(kernel, *leaves(heads, t, d), block))["saved_bytes"]


def attention_step(kernel, heads, t, d, block, causal=True):
    """A function running one forward and backward of the kernel on fixed leaves."""
    q, k, v = leaves(heads, t, d)
    grad = np.ones((1, heads, t, d), np.float32)

    def step():
        for x in (q, k, v):
            x.grad = None
        attention(kernel, q, k, v, block, causal).backward(grad)

    return step


def attention_main(args):
    heads, d, block, causal = args.heads, args.head_size, args.block, not args.bidirectional
    print(f"{'causal' if causal else 'unmasked'} attention, forward + backward, float32, (1, {heads}, T, {d}); flash in {block}×{block} tiles; "
          f"median of {args.steps} steps each, the two alternating step by step")
    print(f"{'T':>6} {'dense ms':>9} {'flash ms':>9} {'flash/dense':>11} {'spread':>11} "
          f"{'dense saved MiB':>15} {'flash saved MiB':>15}")
    for t in args.lengths:
        flash, dense = (attention_step(kernel, heads, t, d, block, causal) for kernel in ("flash", "dense"))
        flash_times, _, dense_times, _, _ = time_steps(flash, args.steps, args.warmup, partner=dense)
        ratios = pair_ratios(flash_times, dense_times)
        dense_ms, flash_ms = (1e3 * statistics.median(every_step(times)) for times in (dense_times, flash_times))
        print(f"{t:>6} {dense_ms:9.1f} {flash_ms:9.1f} {statistics.median(ratios):10.2f}x "
              f"{'{:.2f}-{:.2f}'.format(*quartiles(ratios)):>11} {saved_bytes('dense', heads, t, d, block) / 2**20:15.1f} "
              f"{saved_bytes('flash', heads, t, d, block) / 2**20:15.1f}")
    t, budget = args.beyond, args.budget * 2**20
    scores = heads * t * t * 4  # the dense kernel's (T × T) float32 probabilities per head
    print(f"budget {args.budget} MiB for saved activations: at T = {t} the dense kernel's probabilities alone "
          f"take {scores / 2**20:.0f} MiB {'>' if scores > budget else '≤'} the budget"
          + (" (not run)" if scores > budget else ""))
    if scores > budget:
        kept = saved_bytes("flash", heads, t, d, block)
        seconds = seconds_of(attention_step("flash", heads, t, d, block, causal))
        print(f"flash at T = {t}: saves {kept / 2**20:.1f} MiB ({'within' if kept <= budget else 'over'} the "
              f"budget), one step {seconds:.2f} s")
