"""Chapter 8, part 3: the interleaved schedule — v model chunks per rank, a v times smaller bubble.

    python tutorials/08_1f1b_recomputation/interleaved.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/08_1f1b_recomputation/interleaved.py

Prints: which model stages each rank holds with v = 2 chunks, the simulated timelines
of 1F1B and interleaved 1F1B for p = 2, m = 4 with their bubbles next to the formulas
(a chunk holds 1/v of a stage's blocks, so its forward and backward take 1/v of the
time: both timelines are drawn at the same scale), then real steps of both on this
run's ranks: loss and gradient difference to one device, and the median measured
bubble of REPEATS steps next to the theory. Under --threads the measured times are
not a performance measurement (chapter 7's README, "What the timings mean").
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
from parallel.pipeline import Timeline, bubble_theory, check_schedule, get_schedule, stages_for_rank

SIM_P, SIM_M, V = 2, 4, 2
CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=8, n_head=4, d_model=128)
BATCH, SEQ = 16, 32
REPEATS = 5  # timed steps after a warm-up step: their median bubble is printed


def simulate(say):
    """Print the simulated timelines; return them as [(title, Timeline)] (tutorials/pictures/)."""
    timelines = []
    say(f"simulated, p = {SIM_P} ranks, m = {SIM_M} micro-batches (a rank's whole forward 1 unit, "
        f"backward 2; a chunk's 1/v of that):")
    for name, v in (("1f1b", 1), ("interleaved", V)):
        report = check_schedule(get_schedule(name, SIM_P, SIM_M, v), SIM_P, SIM_M, v,
                                forward_time=1 / v, backward_time=2 / v)
        timeline = Timeline(report.events, SIM_P)
        say(f"\n{name}, v = {v} chunk(s) per rank, makespan {timeline.makespan:g} units:")
        say(timeline.render(slot=1 / V))  # one scale for both: a column is the smallest chunk forward
        say(f"{name} simulated bubble: {timeline.bubble_fraction():.4f}   "
            f"theory (p-1)/(v*m+p-1): {bubble_theory(SIM_P, SIM_M, v):.4f}")
        timelines.append((f"{name}, v = {v}", timeline))
    return timelines


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    p = group.size
    m = 2 * p                      # interleaving needs m to be a multiple of p
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    held = ", ".join("r" if c == 0 else f"{c if c > 1 else ''}p + r" for c in range(V))
    say(f"{CONFIG.n_layer} blocks cut into p*v = {p}*{V} = {p * V} stages; rank r holds stages {held}:")
    for rank in range(p):
        chunks = stages_for_rank(gpt, rank, p, V)
        say(f"  rank {rank}: " + "; ".join(f"chunk {c} = stage {s.stage}, blocks {s.blocks.indices()}"
                                          for c, s in enumerate(chunks)))
    say("")
    simulate(say)

    rng = np.random.default_rng(1)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))
    _, ref_loss = gpt(idx, targets)
    ref_loss.backward()
    say(f"\nreal steps on p = {p} rank(s), m = {m} micro-batches, float64; "
        f"bubble: the median of {REPEATS} steps after a warm-up step:")
    for name, v in (("1f1b", 1), ("interleaved", V)):
        mt.manual_seed(0)
        pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=m, schedule=name, chunks=v)
        pipe.train_step(idx, targets)            # warm-up
        bubbles = []
        for _ in range(REPEATS):                 # one step's timing is noise; the median of several is less so
            loss = pipe.train_step(idx, targets)
            bubbles.append(pipe.bubble()[0])
        grads = pipe.full_grads()
        diff = max(np.abs(grads[n] - q.grad).max() for n, q in gpt.named_parameters())
        say(f"  {name} v={v}: loss difference {abs(loss - ref_loss.item()):.1e}, largest gradient difference "
            f"{diff:.1e}, bubble measured {np.median(bubbles):.3f} theory {pipe.bubble()[1]:.3f} "
            f"(steps: {min(bubbles):.3f} to {max(bubbles):.3f})")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
