"""Chapter 8, part 3: the interleaved schedule — v model chunks per rank, a v times smaller bubble.

    python tutorials/08_1f1b_checkpointing/interleaved.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/08_1f1b_checkpointing/interleaved.py

Prints: which model stages each rank holds with v = 2 chunks, the simulated timelines
of 1F1B and interleaved 1F1B for p = 2, m = 4 with their bubbles next to the formulas,
then real steps of both on this run's ranks: loss and gradient difference to one
device, and the measured bubble next to the theory.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from parallel import Pipeline
from parallel.launch import rank_arguments, run_on_ranks
from parallel.pipeline import Timeline, bubble_theory, check_schedule, get_schedule, stages_for_rank

SIM_P, SIM_M, V = 2, 4, 2
CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=8, n_head=4, d_model=128)
BATCH, SEQ = 16, 32


def simulate(say):
    say(f"simulated, p = {SIM_P} ranks, m = {SIM_M} micro-batches (forward 1 unit, backward 2 per stage):")
    for name, v in (("1f1b", 1), ("interleaved", V)):
        report = check_schedule(get_schedule(name, SIM_P, SIM_M, v), SIM_P, SIM_M, v)
        timeline = Timeline(report.events, SIM_P)
        say(f"\n{name}, v = {v} chunk(s) per rank:")
        say(timeline.render())
        say(f"{name} simulated bubble: {timeline.bubble_fraction():.4f}   "
            f"theory (p-1)/(v*m+p-1): {bubble_theory(SIM_P, SIM_M, v):.4f}")


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    p = group.size
    m = 2 * p                      # interleaving needs m to be a multiple of p
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    say(f"{CONFIG.n_layer} blocks cut into p*v = {p}*{V} = {p * V} stages; rank r holds stages r, p + r:")
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
    say(f"\nreal steps on p = {p} rank(s), m = {m} micro-batches, float64:")
    for name, v in (("1f1b", 1), ("interleaved", V)):
        mt.manual_seed(0)
        pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=m, schedule=name, chunks=v)
        pipe.train_step(idx, targets)            # warm-up
        loss = pipe.train_step(idx, targets)
        grads = pipe.full_grads()
        diff = max(np.abs(grads[n] - q.grad).max() for n, q in gpt.named_parameters())
        measured, theory = pipe.bubble()
        say(f"  {name} v={v}: loss difference {abs(loss - ref_loss.item()):.1e}, largest gradient difference "
            f"{diff:.1e}, bubble measured {measured:.3f} theory {theory:.3f}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
