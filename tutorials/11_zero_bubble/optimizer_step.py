"""Chapter 11, part 3: the optimizer step is the obstacle; post-validation steps around it.

    python tutorials/11_zero_bubble/optimizer_step.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/11_zero_bubble/optimizer_step.py

Prints: the checker's simulation of two consecutive steps of 1F1B, ZB-H1 and ZB-H2
(p = 4, m = 8, F = B = W) without a synchronizing optimizer step, so each rank starts
step 2 as soon as its own list lets it: the time per step next to one synchronous step.
Then real pipeline steps with a global gradient-norm clip, done two ways: synchronous
(every rank waits for the norm, which needs every W of every rank) and post-validated
(each rank steps at once with its unclipped gradients, and rolls the step back and
redoes it clipped when the norm, arriving later, says so): the parameters of the two
ways, and how many steps were rolled back.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import Pipeline
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.pipeline import Action, Timeline, check_schedule, get_schedule

SIM_P, SIM_M = 4, 8
CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, d_model=64)
BATCH, SEQ, M, STEPS, MAX_NORM = 8, 16, 4, 4, 1.0


def two_steps(name):
    """The schedule's lists run twice back to back: micro-batches m..2m-1 are step 2."""
    once = get_schedule(name, SIM_P, SIM_M)
    return [actions + [Action(a.kind, a.microbatch + SIM_M, a.chunk, a.peer) for a in actions] for actions in once]


def simulate(say):
    say(f"simulated, p = {SIM_P}, m = {SIM_M}, F = B = W = 1; a step's compute per rank is {3 * SIM_M} units:")
    for name in ("1f1b", "zb-h1", "zb-h2"):
        one = Timeline(check_schedule(get_schedule(name, SIM_P, SIM_M), SIM_P, SIM_M, weight_time=1.0).events)
        two = Timeline(check_schedule(two_steps(name), SIM_P, 2 * SIM_M, weight_time=1.0).events)
        say(f"  {name:<6} synchronous optimizer step: {one.makespan:g} units per step; "
            f"steps overlapping: {two.makespan - one.makespan:g} units per step")


def local_sum_of_squares(pipe):
    return sum(float(np.vdot(p.grad, p.grad)) for p in pipe.parameters() if p.grad is not None)


def global_norm(pipe):
    """The clip's norm over every stage: a collective, so it needs every rank's last W."""
    return float(np.sqrt(pipe.group.all_reduce(np.array([local_sum_of_squares(pipe)]))[0]))


def clip(pipe, norm):
    scale = MAX_NORM / (norm + 1e-6)
    if scale < 1:
        for p in pipe.parameters():
            p.grad *= scale
    return scale < 1


def train(group, batches, post_validate):
    """STEPS AdamW steps with the global-norm clip; the dense parameters and the rollbacks."""
    mt.manual_seed(0)
    pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=M, schedule="zb-h2")
    opt = AdamW(pipe.parameters(), lr=1e-2)
    rollbacks = 0
    for idx, targets in batches:
        pipe.train_step(idx, targets)
        if not post_validate:
            clip(pipe, global_norm(pipe))   # waits here for the slowest rank's last W
            opt.step()
            continue
        saved = [p.data.copy() for p in pipe.parameters()], opt.state_dict()
        opt.step()                          # optimistic: this rank's step, now
        if clip(pipe, global_norm(pipe)):   # the check arrives later; rarely it fails
            for p, data in zip(pipe.parameters(), saved[0]):
                p.data[...] = data
            opt.load_state_dict(saved[1])
            opt.step()
            rollbacks += 1
    return pipe.full_state_dict(), rollbacks


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    simulate(say)

    rng = np.random.default_rng(2)
    batches = [tuple(rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2)) for _ in range(STEPS)]
    sync, _ = train(group, batches, post_validate=False)
    post, rollbacks = train(group, batches, post_validate=True)
    diff = max(np.abs(sync[name] - post[name]).max() for name in sync)
    say(f"\nreal: zb-h2 on p = {group.size} rank(s), {STEPS} AdamW steps, gradient norm clipped to {MAX_NORM}:")
    say(f"  synchronous vs post-validated parameters, largest difference: {diff:.1e}")
    say(f"  steps rolled back: {rollbacks} of {STEPS}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
