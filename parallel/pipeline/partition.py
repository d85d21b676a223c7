"""Cut a GPT into pipeline stages: how many blocks each stage gets, and the stages (each a
minitensor.models.GPTSlice).

A `balance` is a list with one entry per stage: the number of consecutive blocks it
holds (torchgpipe's word). The embeddings always go to the first stage and the final
LayerNorm, lm_head and loss to the last. A balance is given explicitly or computed
from a cost per block — parameter count (memory) or measured time (speed) — by
`balance_by_cost`, which finds the contiguous split whose most expensive stage is as
cheap as possible (the pipeline runs at the pace of its slowest stage).

With v model chunks per rank (the interleaved schedule) there are p·v stages and
rank r holds stages r, p + r, 2p + r, ...; under DualPipeV's V, stages r and 2p-1-r; under
DualPipe's mirror, p stages and rank r holds stages r and p-1-r (`placement.stage_of`).
"""
import time

import numpy as np

from minitensor.models.slice import GPTSlice

from .placement import num_stages, stage_of


def check_stage_count(n_layer, num_stages):
    if not isinstance(num_stages, (int, np.integer)) or num_stages < 1:
        raise ValueError(f"the number of pipeline stages must be a positive int, got {num_stages!r}")
    if num_stages > n_layer:
        raise ValueError(f"cannot cut a GPT with n_layer={n_layer} blocks into {num_stages} pipeline stages: "
                         f"every stage needs at least one block")


def check_balance(balance, n_layer, num_stages):
    """A ValueError naming the values unless `balance` splits n_layer blocks into num_stages stages."""
    check_stage_count(n_layer, num_stages)
    if len(balance) != num_stages:
        raise ValueError(f"balance {list(balance)} has {len(balance)} entries for {num_stages} pipeline stages")
    if any(not isinstance(b, (int, np.integer)) or b < 1 for b in balance):
        raise ValueError(f"balance {list(balance)}: every stage needs a whole number ≥ 1 of blocks")
    if sum(balance) != n_layer:
        raise ValueError(f"balance {list(balance)} sums to {sum(balance)}, but the GPT has n_layer={n_layer} blocks")


def block_ranges(balance):
    """The block indices of each stage: [2, 3] -> [range(0, 2), range(2, 5)]."""
    bounds = np.cumsum([0, *balance])
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def balance_by_cost(costs, num_stages, first_extra=0.0, last_extra=0.0):
    """Blocks per stage minimising the largest stage cost.

    costs[i] is block i's cost; the first stage also pays `first_extra` (embeddings),
    the last `last_extra` (head and loss). Dynamic programming over
    best[s][i] = the smallest possible maximum when stages 0..s-1 hold blocks 0..i-1.
    """
    n = len(costs)
    check_stage_count(n, num_stages)
    prefix = np.cumsum([0.0, *costs])

    def cost(s, i, j):  # stage s holding blocks i..j-1
        return prefix[j] - prefix[i] + (first_extra if s == 0 else 0.0) + (last_extra if s == num_stages - 1 else 0.0)

    best = np.full((num_stages + 1, n + 1), np.inf)
    cut = np.zeros((num_stages + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                candidate = max(best[s - 1][i], cost(s - 1, i, j))
                if candidate < best[s][j]:
                    best[s][j], cut[s][j] = candidate, i
    balance, j = [], n
    for s in range(num_stages, 0, -1):
        balance.append(int(j - cut[s][j]))
        j = int(cut[s][j])
    return balance[::-1]


def balance_by_parameters(model, num_stages):
    """Balance the parameter count (the memory of weights, gradients and optimizer state)."""
    count = lambda names: float(sum(getattr(model, name).num_parameters() for name in names))
    return balance_by_cost([b.num_parameters() for b in model.blocks], num_stages,
                           first_extra=count(model.first_parts), last_extra=count(model.last_parts))


def balance_by_time(model, num_stages, idx, targets, repeats=3):
    """Balance the measured forward + backward time of each block on the batch `idx`."""
    def seconds(fn):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        model.zero_grad()
        return float(np.median(times))

    x = model.embed(idx).detach()
    x.requires_grad = True
    embed = seconds(lambda: model.embed(idx).sum().backward())
    blocks = [seconds(lambda b=b: b(x).sum().backward()) for b in model.blocks]
    head = seconds(lambda: model.head(x, targets)[1].backward())
    return balance_by_cost(blocks, num_stages, first_extra=embed, last_extra=head)


def split_gpt(model, num_stages, balance=None):
    """All `num_stages` stages of `model` (default balance: by parameter count)."""
    balance = balance_by_parameters(model, num_stages) if balance is None else list(balance)
    check_balance(balance, model.config.n_layer, num_stages)
    return [GPTSlice(model, blocks, s, num_stages) for s, blocks in enumerate(block_ranges(balance))]


def stages_for_rank(model, rank, p, v=1, balance=None, placement="loop"):
    """The v stages that rank `rank` of a p-rank pipeline holds, in chunk order."""
    stages = split_gpt(model, num_stages(p, v, placement), balance)
    return [stages[stage_of(rank, chunk, p, placement)] for chunk in range(v)]
