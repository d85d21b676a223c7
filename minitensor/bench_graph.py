"""`python -m minitensor.bench --graph [--configs small medium]`: what the graph rewrites
change on the benchmark's GPTs.

Traces one forward + loss, rewrites it with `minitensor.graph.passes.DEFAULT_PASSES`,
and prints before → after: nodes, FLOPs, bytes moved and saved-activation bytes (from the
graph's node costs: each node reads its inputs and writes its output once, views move
nothing), which ops changed, the loss difference, and the median training step time
(forward, backward, AdamW; the two graphs alternating step by step) with the peak memory
of a step.
"""
import functools
import statistics
from collections import Counter

import minitensor as mt
from minitensor import bench_timing, graph
from minitensor.graph.ir import LEAF_OPS
from minitensor.graph.passes import DEFAULT_PASSES, fuse_qkv
from minitensor.models.gpt import GPT


def graph_step(config, batch, rewrite):
    """(a training step through the traced (and maybe rewritten) graph of a fresh GPT, its
    GraphModule, its first loss)."""
    mt.manual_seed(0)
    model = GPT(config)
    idx, targets = bench_timing.random_batch(config, batch)
    gm = graph.trace(model.forward, idx, targets)
    if rewrite:
        gm = gm.transform(*DEFAULT_PASSES)
    step = bench_timing.training_step(model, gm, idx, targets)
    return step, gm, gm(idx, targets)[1].item()


def op_changes(before, after):
    """"Op n → m" for each op whose count the passes changed."""
    count = [Counter(n.op for n in g.nodes if n.op not in LEAF_OPS) for g in (before, after)]
    return ", ".join(f"{op} {count[0][op]} → {count[1][op]}" for op in sorted(count[0] | count[1])
                     if count[0][op] != count[1][op])


def graph_main(args, kept):
    for name in args.configs:
        compare(name, args, kept)


def compare(name, args, kept):
    """Print the before → after table, the ops changed, the losses and the step times."""
    config, batch = bench_timing.CONFIGS[name]
    before_step, before, loss = graph_step(config, batch, rewrite=False)
    after_step, after, loss_after = graph_step(config, batch, rewrite=True)
    print(f"graph rewrites on the {name} GPT (batch {batch}, T {config.block_size}, float32), passes: "
          f"{', '.join(p.__name__ for p in DEFAULT_PASSES)}")
    print(f"{'':<20} {'before':>14} {'after':>14} {'ratio':>7}")
    totals = before.graph.totals(), after.graph.totals()
    for key, label in (("nodes", "nodes"), ("flops", "FLOPs"), ("bytes_moved", "bytes moved"),
                       ("saved_bytes", "saved bytes")):
        print(f"{label:<20} {totals[0][key]:>14,} {totals[1][key]:>14,} {totals[1][key] / totals[0][key]:6.3f}x")
    print(f"ops changed: {op_changes(before.graph, after.graph)}")
    if "Concat" not in {n.op for n in after.graph.nodes}:
        forced = before.transform(functools.partial(fuse_qkv, only_if_fewer_bytes=False)).graph.totals()
        print(f"fuse_qkv not applied: at {batch * config.block_size} tokens ≤ 3·d_model = {3 * config.d_model} "
              f"it would move {forced['bytes_moved'] - totals[0]['bytes_moved']:+,} bytes (copying the weights "
              f"costs more than reading x once instead of three times)")
    print(f"loss before {loss:.7f} after {loss_after:.7f} (|difference| {abs(loss - loss_after):.1e})")
    rounds, _, rounds_after, _, _ = bench_timing.time_steps(before_step, args.steps, args.warmup, partner=after_step)
    times, times_after = bench_timing.every_step(rounds), bench_timing.every_step(rounds_after)
    ms = [1e3 * statistics.median(t) for t in (times, times_after)]
    peaks = [bench_timing.peak_step_bytes(s) for s in (before_step, after_step)]
    ratios = bench_timing.pair_ratios(rounds_after, rounds)
    print(f"step time (median of {args.steps}, alternating steps; freed memory "
          f"{'kept' if kept else 'released'}): before {ms[0]:.1f} ms, after {ms[1]:.1f} ms, "
          f"ratio {statistics.median(ratios):.3f}x; peak step memory before {bench_timing.mib(peaks[0])} MiB, "
          f"after {bench_timing.mib(peaks[1])} MiB")
    spread = [(high - low) * 1e3 for low, high in (bench_timing.quartiles(t) for t in (times, times_after))]
    print(f"run-to-run spread (interquartile range): before {spread[0]:.1f} ms, after {spread[1]:.1f} ms\n")
