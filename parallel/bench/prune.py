"""What pruning buys in time: a training step of the dense GPT, of the same GPT with 90% of its
block weights zeroed (unstructured), and with half its heads and MLP neurons removed (structured).

    python -m parallel.bench prune [--steps 7] [--warmup 2]

The model: GPT with d_model 128, 2 layers, 8 heads, block 64, vocab 64, float32, batch 8,
one process, the three models taking turns step by step (so a change of the machine's load
slows them alike). Printed per model: the median forward + backward time over the timed steps,
its ratio to the dense one, and the parameter count (for the unstructured model: the
non-zero ones). Zeros in a dense matrix cost the same multiply-adds as any other number,
so unstructured sparsity saves no time here (it needs sparse kernels or hardware that
skips zeros); removing whole heads and neurons makes every matrix smaller, and that does.
"""
import copy
import functools
import statistics

import numpy as np

import minitensor as mt
from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import timed_turns
from minitensor.models import GPT, GPTConfig
from minitensor.prune import MagnitudePruner, prune_heads, prune_neurons, units_to_prune

CONFIG = dict(vocab_size=64, block_size=64, n_layer=2, n_head=8, d_model=128)
BATCH = 8


def models():
    mt.manual_seed(0)
    dense = GPT(GPTConfig(**CONFIG))
    unstructured = copy.deepcopy(dense)
    pruner = MagnitudePruner(unstructured, 0.9)
    zeros = sum(int((~m).sum()) for m in pruner.masks.values())
    structured = copy.deepcopy(dense)
    prune_heads(structured, units_to_prune(structured, "heads", CONFIG["n_head"] // 2))
    prune_neurons(structured, units_to_prune(structured, "neurons", structured.config.mlp_width // 2))
    return [("dense", dense, dense.num_parameters()),
            ("unstructured 90%", unstructured, unstructured.num_parameters() - zeros),
            ("structured 1/2 heads+neurons", structured, structured.num_parameters())]


def batch():
    rng = np.random.default_rng(0)
    return [rng.integers(0, CONFIG["vocab_size"], (BATCH, CONFIG["block_size"])) for _ in range(2)]


def forward_backward(model, idx, targets):
    model.zero_grad()
    model(idx, targets)[1].backward()


def medians_taking_turns(named_models, steps, warmup):
    """{name: median step time} of forward + backward, the models taking turns step by step
    (a machine whose load changes slows them alike, not whichever ran last)."""
    idx, targets = batch()
    calls = [functools.partial(forward_backward, model, idx, targets) for _, model, _ in named_models]
    return {name: statistics.median(t) for (name, _, _), t in zip(named_models, timed_turns(calls, steps, warmup))}


def main(argv):
    parser = bench_parser("python -m parallel.bench prune", __doc__, steps=7, warmup=2)
    return run_bench(parser, argv, run)


def run(args):
    print(f"GPT {CONFIG}, batch {BATCH}, float32, forward + backward, median of {args.steps} steps (taking turns)")
    named_models = models()
    medians = medians_taking_turns(named_models, args.steps, args.warmup)
    dense_time = medians["dense"]
    for name, _, params in named_models:
        seconds = medians[name]
        print(f"  {name:<30} median {seconds * 1e3:8.1f} ms   ratio to dense {seconds / dense_time:5.2f}   "
              f"parameters {params:>9,}")
    return 0
