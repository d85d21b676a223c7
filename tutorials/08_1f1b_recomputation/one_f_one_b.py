"""Chapter 8, part 1: 1F1B stores at most p micro-batches per stage; GPipe stores all m.

    python tutorials/08_1f1b_recomputation/one_f_one_b.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/08_1f1b_recomputation/one_f_one_b.py

Prints: the simulated timelines of GPipe and 1F1B for p = 4 stages and m = 8
micro-batches with their bubbles and the peak stored micro-batches of every stage,
then a real step of both schedules on this run's ranks: loss and gradient difference
to one device, the difference between the two schedules' gradients, and the peak
stored micro-batches and activation bytes per stage (with a bar per stage).
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from parallel import Pipeline
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.pipeline import Timeline, bubble_theory, check_schedule, get_schedule

SIM_P, SIM_M = 4, 8
CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, d_model=64)
BATCH, SEQ, M = 8, 16, 8


def simulate(say):
    """Print the simulated timelines; return them as [(schedule, Timeline)] (tutorials/pictures/)."""
    timelines = []
    say(f"simulated, p = {SIM_P} stages, m = {SIM_M} micro-batches (forward 1 unit, backward 2):")
    for name in ("gpipe", "1f1b"):
        report = check_schedule(get_schedule(name, SIM_P, SIM_M), SIM_P, SIM_M)
        timeline = Timeline(report.events, SIM_P)
        say(f"\n{name}:")
        say(timeline.render())
        say(f"{name} simulated bubble: {timeline.bubble_fraction():.4f} (theory {bubble_theory(SIM_P, SIM_M):.4f})")
        say(f"{name} simulated peak stored micro-batches per stage: {report.peak_activations}")
        timelines.append((name, timeline))
    return timelines


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    simulate(say)

    p = group.size
    rng = np.random.default_rng(1)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    _, ref_loss = gpt(idx, targets)
    ref_loss.backward()

    say(f"\nreal step on p = {p} rank(s), m = {M} micro-batches of {BATCH // M} sequence(s), float64:")
    peaks, grads = {}, {}
    for name in ("gpipe", "1f1b"):
        mt.manual_seed(0)
        pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=M, schedule=name)
        loss = pipe.train_step(idx, targets)
        grads[name] = pipe.full_grads()
        diff = max(np.abs(grads[name][n] - q.grad).max() for n, q in gpt.named_parameters())
        counts = group.all_gather(np.array([pipe.peak_activations], dtype=np.int64))
        nbytes = group.all_gather(np.array([pipe.peak_activation_bytes], dtype=np.int64))
        peaks[name] = nbytes
        say(f"  {name}: loss difference {abs(loss - ref_loss.item()):.1e}, largest gradient difference {diff:.1e}")
        say(f"  {name} peak stored micro-batches per stage: {counts.tolist()}")
    same = max(np.abs(grads["gpipe"][n] - grads["1f1b"][n]).max() for n in grads["gpipe"])
    say(f"  gpipe vs 1f1b gradients, largest difference: {same:.1e} (same accumulation order)")

    largest = max(int(b.max()) for b in peaks.values())
    say("\npeak activation bytes per stage:")
    for name, nbytes in peaks.items():
        for stage, b in enumerate(nbytes):
            say(f"  {name:<6} stage {stage}  {int(b):>8}  {'#' * max(1, round(40 * b / largest))}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
