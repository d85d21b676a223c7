"""Chapter 11, part 2: 1F1B, ZB-H1 and ZB-H2 side by side, simulated and for real.

    python tutorials/11_zero_bubble/three_timelines.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/11_zero_bubble/three_timelines.py

Prints: the checker's simulated timelines of the three schedules for p = 4 stages and
m = 8 micro-batches with F = B = W (a whole backward is B + W), each with its bubble
next to its closed form, its bubble inside each rank's own span, and its peak stored
micro-batches per stage; then a real step of each on this run's ranks: loss and
gradient difference to one device, the difference between the schedules' gradients,
the measured bubble and the peak stored micro-batches per stage.
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
SCHEDULES = ("1f1b", "zb-h1", "zb-h2")
CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, d_model=64)
BATCH, SEQ, M = 8, 16, 8


def simulate(say):
    """Print the simulated timelines; return them as [(schedule, Timeline)] (tutorials/pictures/)."""
    timelines = []
    say(f"simulated, p = {SIM_P} stages, m = {SIM_M} micro-batches, F = B = W = 1 unit "
        f"(1F1B's backward is B + W = 2):")
    for name in SCHEDULES:
        report = check_schedule(get_schedule(name, SIM_P, SIM_M), SIM_P, SIM_M, weight_time=1.0)
        timeline = Timeline(report.events, SIM_P)
        say(f"\n{name}:")
        say(timeline.render())
        say(f"{name} simulated bubble: {timeline.bubble_fraction():.4f} "
            f"(closed form {bubble_theory(SIM_P, SIM_M, schedule=name):.4f})")
        say(f"{name} bubble inside the ranks' spans: {timeline.inner_bubble_fraction():.4f}")
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
    grads = {}
    for name in SCHEDULES:
        mt.manual_seed(0)
        pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=M, schedule=name)
        loss = pipe.train_step(idx, targets)
        grads[name] = pipe.full_grads()
        diff = max(np.abs(grads[name][n] - q.grad).max() for n, q in gpt.named_parameters())
        measured, theory = pipe.bubble()
        counts = group.all_gather(np.array([pipe.peak_activations], dtype=np.int64))
        say(f"  {name}: loss difference {abs(loss - ref_loss.item()):.1e}, largest gradient difference {diff:.1e}")
        say(f"  {name}: measured bubble {measured:.3f} (theory at equal costs {theory:.3f})")
        say(f"  {name} peak stored micro-batches per stage: {counts.tolist()}")
    for name in SCHEDULES[1:]:
        same = max(np.abs(grads[name][n] - grads["1f1b"][n]).max() for n in grads["1f1b"])
        say(f"  1f1b vs {name} gradients, largest difference: {same:.1e}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
