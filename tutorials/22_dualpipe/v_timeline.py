"""Chapter 22, part 1: DualPipeV's V, simulated and run for real.

    python tutorials/22_dualpipe/v_timeline.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/22_dualpipe/v_timeline.py

Prints: the checker's simulated timelines of 1F1B on 8 ranks (8 stages) and of DualPipeV on
4 ranks holding the same 8 stages in a V (rank r: stages r and 7-r), m = 10 micro-batches,
F = B = W = 1 per stage (a whole backward is B + W = 2); each rank's idle time next to
DeepSeek-V3's formula and the peak stored (micro-batch, stage) graphs per rank. Then a real
DualPipeV step on this run's ranks: loss and gradients against one device, the stages each
rank holds, and the peak graphs it held.
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
from parallel.pipeline import Timeline, check_schedule, get_schedule, placement_of

STAGES, SIM_M = 8, 10
CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=8, n_head=4, d_model=64)


def simulate(say):
    """Print the two simulated timelines; return them as [(title, Timeline)] (tutorials/pictures/)."""
    say(f"simulated: {STAGES} stages, m = {SIM_M} micro-batches, F = B = W = 1 per stage")
    return [simulated(say, "1f1b", STAGES, SIM_M, work=SIM_M * 3, formula=(STAGES - 1) * 3),
            simulated(say, "dualpipev", STAGES // 2, SIM_M, work=2 * SIM_M * 3,
                      formula=(STAGES // 2 - 1) * (3 + 2 - 3))]  # F&B = F + B on a CPU


def simulated(say, name, ranks, m, work, formula, what=""):
    """Check `name`'s lists on `ranks` ranks (F = B = W = 1) and print its timeline, its idle time per rank
    (the makespan less a rank's `work`) beside table 2's `formula`, and its peak stored graphs;
    return (title, Timeline)."""
    chunks = 2 if name.startswith("dualpipe") else 1
    report = check_schedule(get_schedule(name, ranks, m, chunks), ranks, m, chunks, weight_time=1.0,
                            placement=placement_of(name))
    timeline = Timeline(report.events, ranks)
    title = f"{name}, {ranks} ranks" + (f" ({what})" if what else "")
    say(f"\n{name} on {ranks} ranks" + (f" ({what})" if what else "") + ":")
    say(timeline.render())
    say(f"{name} idle time per rank: {timeline.makespan - work:g} units (table 2's formula {formula:g}); "
        f"bubble {timeline.bubble_fraction():.4f}")
    say(f"{name} peak stored graphs per rank: {report.peak_activations}")
    return title, timeline


def one_device_step(p):
    """(m, idx, targets, the float64 GPT after its backward, its loss): the step a real run on p ranks
    repeats, m = 2p + 2 micro-batches of two sequences."""
    m = 2 * p + 2
    rng = np.random.default_rng(1)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (2 * m, 16)) for _ in range(2))
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    _, loss = gpt(idx, targets)
    loss.backward()
    return m, idx, targets, gpt, loss


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    simulate(say)

    p = group.size
    m, idx, targets, gpt, ref_loss = one_device_step(p)
    mt.manual_seed(0)
    pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=m, schedule="dualpipev", chunks=2)
    loss = pipe.train_step(idx, targets)
    grads = pipe.full_grads()
    held = group.all_gather(np.array([s.stage for s in pipe.stages] + [pipe.peak_activations], dtype=np.int64))
    diff = max(np.abs(grads[n] - q.grad).max() for n, q in gpt.named_parameters())
    say(f"\nreal dualpipev step on p = {p} rank(s), {2 * p} stages, m = {m}, float64:")
    say(f"  loss difference {abs(loss - ref_loss.item()):.1e}, largest gradient difference {diff:.1e}")
    for rank, (first, second, peak) in enumerate(held.reshape(-1, 3)):
        say(f"  rank {rank} holds stages {first} and {second}; peak stored graphs {peak}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
