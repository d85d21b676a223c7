"""Chapter 8, part 2: activation recomputation — keep the stage input, recompute the rest.

    python tutorials/08_1f1b_recomputation/recomputation.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/08_1f1b_recomputation/recomputation.py

Prints: for one transformer block, the bytes its graph keeps for backward with and
without minitensor.recompute, the forwards run by backward, and the gradient
difference; then a 1F1B pipeline step with and without recomputation on this run's
ranks: gradient difference to one device, peak activation bytes per stage (a bar
each), forward passes per step, and the step time (which varies from run to run).
"""
import os
import time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor import graph
from minitensor.recompute import recompute
from minitensor.models import GPT, GPTConfig
from minitensor.models.gpt import Block
from parallel import Pipeline
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments

CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, d_model=64)
BATCH, SEQ, M = 8, 32, 4


def count_forwards(module):
    """Make `module` count its forward calls in `module.forwards`."""
    module.forwards = 0
    plain = module.forward

    def counted(*args, **kwargs):
        module.forwards += 1
        return plain(*args, **kwargs)
    module.forward = counted
    return module


def one_block(say):
    mt.manual_seed(0)
    block = count_forwards(Block(CONFIG).double())
    x_data = np.random.default_rng(1).standard_normal((2, SEQ, CONFIG.d_model))
    grads = {}
    say(f"one block, input {x_data.shape}, float64:")
    for use in (False, True):
        x = mt.Tensor(x_data.copy(), requires_grad=True)
        block.zero_grad()
        block.forwards = 0
        mt.manual_seed(1)                  # the same dropout draws in both runs (if you turn dropout on)
        y = recompute(block, x) if use else block(x)
        kept = graph.totals(y)["saved_bytes"]
        forwards_before = block.forwards
        (y * y).sum().backward()
        grads[use] = [x.grad] + [p.grad.copy() for p in block.parameters()]
        label = "recomputed" if use else "plain"
        say(f"  {label:<10}: saved bytes {kept:>8}, forwards in forward {forwards_before}, "
            f"forwards in backward {block.forwards - forwards_before}")
    say(f"  recomputed vs plain gradients, largest difference: "
        f"{max(np.abs(a - b).max() for a, b in zip(grads[False], grads[True])):.1e}")


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    one_block(say)

    rng = np.random.default_rng(2)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    _, ref_loss = gpt(idx, targets)
    ref_loss.backward()

    say(f"\n1F1B on p = {group.size} rank(s), m = {M} micro-batches:")
    peaks = {}
    for use in (False, True):
        label = "recomputed" if use else "plain"
        mt.manual_seed(0)
        pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=M, schedule="1f1b", recompute=use)
        stage = count_forwards(pipe.stages[0])
        pipe.train_step(idx, targets)                    # warm-up
        stage.forwards = 0
        start = time.perf_counter()
        loss = pipe.train_step(idx, targets)
        seconds = group.all_reduce(np.array([time.perf_counter() - start]), op="max")[0]
        grads = pipe.full_grads()
        diff = max(np.abs(grads[n] - q.grad).max() for n, q in gpt.named_parameters())
        peaks[label] = group.all_gather(np.array([pipe.peak_activation_bytes], dtype=np.int64))
        forwards = group.all_gather(np.array([stage.forwards], dtype=np.int64))
        say(f"  {label}: loss difference {abs(loss - ref_loss.item()):.1e}, largest gradient difference {diff:.1e}")
        say(f"  {label}: stage forwards per step {forwards.tolist()} for m = {M}; step time {seconds:.3f} s")

    largest = max(int(b.max()) for b in peaks.values())
    say("\npeak activation bytes per stage:")
    for label, nbytes in peaks.items():
        for s, b in enumerate(nbytes):
            say(f"  {label:<12} stage {s}  {int(b):>9}  {'#' * max(1, round(40 * b / largest))}")
    say(f"  recomputed / plain, summed over stages: {peaks['recomputed'].sum() / peaks['plain'].sum():.4f}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
