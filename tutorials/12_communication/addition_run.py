"""The chapter's small training run: the addition task on a small GPT, data parallel over
the ranks, with any communication hook or local SGD. Imported by error_feedback.py, and by
chapter 13's local_sgd.py and staleness.py (not a script of its own)."""
import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import DataParallel
from parallel.data_parallel.local_sgd import DiLoCo

TASK = AdditionTask(digits=2, seed=0)
CONFIG = GPTConfig(vocab_size=TASK.vocab_size, block_size=TASK.block_size, n_layer=2, n_head=4, d_model=32)
BATCH, LR = 32, 3e-3


def batch_of_rank(group, step, seed):
    """This rank's rows of global batch `step` (the same global batch on every rank)."""
    idx, targets = TASK.get_batch(BATCH, generator=np.random.default_rng([seed, step]))
    rows = slice(group.rank * BATCH // group.size, (group.rank + 1) * BATCH // group.size)
    return idx[rows], targets[rows]


def train(group, steps, hook=None, local_steps=None, seed=0, outer_lr=None, outer_momentum=0.9, outer_class=DiLoCo):
    """AdamW for `steps` steps; returns (mean loss of the last 10 steps over ranks, dp bytes per step
    counted by the group on this rank, the trained model). With `local_steps`, the outer
    optimizer is an `outer_class` (DiLoCo or a subclass), kept as model.outer."""
    mt.manual_seed(seed)
    model = GPT(CONFIG)
    dp = DataParallel(model, group)  # broadcasts rank 0's weights: the replicas start as one model
    if hook is not None:
        dp.register_comm_hook(hook)
    opt = AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    outer = outer_class(dp.reducer, local_steps, outer_lr, outer_momentum) if local_steps else None
    model.outer = outer
    group.reset_stats()
    losses = []
    for step in range(steps):
        opt.zero_grad()
        idx, targets = batch_of_rank(group, step, seed)
        if outer is None:
            _, loss = dp(idx, targets)  # backward averages the gradients over the ranks
        else:
            with dp.no_sync():  # local SGD: no gradient communication; the outer step averages
                _, loss = dp(idx, targets)
        loss.backward()
        opt.step()
        if outer is not None:
            outer.step()
        losses.append(loss.item())
    if outer is not None and outer.inner_steps:
        outer.sync()
    nbytes = sum(counts["bytes"] for kind, counts in group.stats().items() if kind != "broadcast") / steps
    last = group.all_reduce(np.array([np.mean(losses[-10:])]))[0] / group.size
    return float(last), nbytes, model
