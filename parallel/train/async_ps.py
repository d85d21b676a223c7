"""`python -m parallel.train --async-staleness S`: the addition (or text) task trained by an
asynchronous parameter server (parallel.data_parallel.parameter_server): rank 0 the server, ranks
1..dp the workers, each taking its rows of the global batch; world = dp + 1 ranks.

The server's optimizer is the job's AdamW with its learning-rate schedule, so S = 0 is
the synchronous data-parallel run of the same flags. Which parameter version each worker
computes on is scripted from --seed (parallel.data_parallel.parameter_server.scripted_delays)."""
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW

from ..comm.link import with_link
from ..data_parallel.parameter_server import describe_roles, run_parameter_server, scripted_delays, staleness_schedule
from .errors import configure_world
from .task import evaluate, global_batch, make_task


def train_parameter_server(args, learning_rate, say):
    group = with_link(configure_world(args), args.link)
    task = make_task(args)
    config = GPTConfig(vocab_size=task.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, d_model=args.d_model)
    mt.manual_seed(args.seed)
    gpt = GPT(config, dtype=np.dtype(args.dtype))
    optimizer = AdamW(gpt.parameters(), lr=args.lr, weight_decay=args.weight_decay, moment_dtype=args.moment_dtype)
    workers, rows = args.dp, args.batch // args.dp
    tau = staleness_schedule(scripted_delays(args.seed, workers, args.steps), args.async_staleness)

    def batch_of(worker, step):
        idx, targets = global_batch(task, args, step + 1)
        return idx[worker * rows:(worker + 1) * rows], targets[worker * rows:(worker + 1) * rows]
    lag = np.mean([t - v for row in tau for t, v in enumerate(row)])
    say(group, f"{describe_roles(group)}; staleness bound {args.async_staleness}, scripted delays from seed "
               f"{args.seed}: mean staleness {lag:.2f} rounds")
    out = run_parameter_server(group, gpt, optimizer, batch_of, args.steps, tau, lambda t: learning_rate(args, t + 1))
    mine = np.zeros(args.steps) if group.rank == 0 else np.array(out)
    losses = list(group.all_reduce(mine) / workers)  # the mean over the workers of each round's loss
    result = {"losses": losses, "metric": None, "check": None}
    if group.rank == 0:
        name, value = evaluate(gpt, task)
        result["metric"] = value
        say(group, f"step {args.steps}/{args.steps}  loss {losses[-1]:.4f}\n{name}: {value:.4f}")
    return result
