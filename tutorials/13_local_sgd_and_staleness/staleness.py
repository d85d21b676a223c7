"""Chapter 13, part 2: an asynchronous parameter server — stale parameters instead of waiting.

    python tutorials/13_local_sgd_and_staleness/staleness.py --threads 4 [--steps 60]
    mpiexec -n 4 python -m mpi4py tutorials/13_local_sgd_and_staleness/staleness.py

Rank 0 is the server (parameters and AdamW), ranks 1..3 are workers; one round in five
of each worker is a straggler, 4× longer (scripted: parallel.data_parallel.parameter_server.scripted_delays).
Each staleness bound s lets a worker run up to s rounds ahead on old parameters. For s =
0, 1, 2, 4: the virtual time the run takes (a straggler no longer holds everyone back),
the mean staleness of the gradients, the final loss; s = 0 is synchronous training
(printed: its difference to one device), and every run replays bit for bit in one
process (`simulate`), because the schedule, not the thread scheduler, decides the order.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "12_communication"))  # chapter 12's task and model
from addition_run import CONFIG, TASK

import minitensor as mt
import parallel
from minitensor.models.gpt import GPT
from minitensor.optim import AdamW
from parallel.data_parallel.parameter_server import (
    describe_roles,
    run_parameter_server,
    scripted_delays,
    simulate,
    staleness_schedule,
)

SEED, ROWS = 0, 10  # rows per worker


def global_batch(step, workers):
    return TASK.get_batch(ROWS * workers, generator=np.random.default_rng([SEED, step]))


def batch_of(worker, step, workers):
    """Worker w's rows of global batch `step`."""
    idx, targets = global_batch(step, workers)
    return idx[worker * ROWS:(worker + 1) * ROWS], targets[worker * ROWS:(worker + 1) * ROWS]


def fresh():
    mt.manual_seed(SEED)
    model = GPT(CONFIG).double()
    return model, AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)


def mean_loss(model, steps, workers):
    """The final model's loss on the last 5 global batches."""
    return float(np.mean([model(*global_batch(s, workers))[1].item() for s in range(steps - 5, steps)]))


def main(args):
    group = parallel.world()
    workers = group.size - 1
    delays = scripted_delays(SEED, workers, args.steps)
    feed = lambda w, t: batch_of(w, t, workers)  # noqa: E731
    rows = []
    for s in (0, 1, 2, 4):
        tau = staleness_schedule(delays, s)
        model, opt = fresh()
        out = run_parameter_server(group, model, opt, feed, args.steps, tau)
        if group.rank == 0:
            replay = simulate(*fresh(), feed, args.steps, tau)
            rows.append((s, tau, out, replay, mean_loss(model, args.steps, workers)))
    if group.rank != 0:
        return
    print(describe_roles(group) + "; one round in five of each worker is 4× longer (scripted)")
    for s, tau, out, replay, loss in rows:
        finish = virtual_finish(delays, tau, s)
        lag = np.mean([t - v for row in tau for t, v in enumerate(row)])
        print(f"  s = {s}: virtual time {finish:7.1f}, mean staleness {lag:.2f} rounds, final loss {loss:.4f}, "
              f"replayed bit for bit in one process: {np.array_equal(out, replay)}")
    difference = synchronous_difference(rows[0][2], args.steps, workers)
    print(f"s = 0 vs synchronous training on one device, largest relative difference: {difference:.1e}")


def virtual_finish(delays, tau, s):
    """When the last round ends on the virtual clock (the schedule's own bookkeeping, repeated)."""
    ready, finish = [0.0], [0.0] * len(delays)
    for t in range(len(delays[0])):
        for w in range(len(delays)):
            finish[w] = max(finish[w], ready[max(0, t - s)]) + delays[w][t]
        ready.append(max(finish))
    return ready[-1]


def synchronous_difference(flat, steps, workers):
    model, opt = fresh()
    for t in range(steps):
        opt.zero_grad()
        model(*global_batch(t, workers))[1].backward()
        opt.step()
    ref = np.concatenate([p.data.reshape(-1) for p in model.parameters()])
    return float(np.abs(flat - ref).max() / np.abs(ref).max())


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0], default_threads=4)
    parser.add_argument("--steps", type=int, default=60, help="rounds (default 60)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
