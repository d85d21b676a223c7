"""Chapter 20: device-limited routing caps how many ranks a token's rows reach, and since the
dispatcher sends one row per (token, rank), the all-to-all bytes fall with the cap. One training
step of HybridGPT at dp = ep = 4 (E = 16, top-4: 4 experts per rank), without a limit and with at
most M = 3, 2, 1 ranks per token; per M: how many tokens reach 1, 2, 3, 4 ranks (the first MoE
layer, all ranks), the mean of them, rank 0's all-to-all bytes counted against the formula, and
the bytes of the mean rank against the planner's estimate (uniform routing, capped at M).

    python tutorials/20_mixture_of_experts/fan_out.py
"""
import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask
from minitensor.models.gpt import GPT, GPTConfig
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh
from parallel.plan.moe import all_to_all_bytes, balanced_all_to_all_bytes

EXPERTS, TOP_K, EP, BATCH = 16, 4, 4, 32


def config(task, limit):
    return GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=2, n_head=4, d_model=32,
                     n_experts=EXPERTS, top_k=TOP_K, expert_hidden=32, expert_groups=EP, max_groups_per_token=limit)


def one_step(task, limit):
    """(tokens reaching r = 1..EP ranks, summed over the ranks; every rank's (counted, formula) bytes)."""
    idx, targets = task.get_batch(BATCH, generator=np.random.default_rng(1))
    cfg = config(task, limit)

    def step():
        mt.manual_seed(0)
        model = HybridGPT(GPT(cfg), Mesh(EP, ep=EP))
        model.reset_communication_stats()
        model.train_step(idx, targets)
        layers, me = model.moe_layers(), model.mesh.ep_rank
        ranks = [len(set(row // (EXPERTS // EP))) for row in layers[0].chosen]
        formula = sum(all_to_all_bytes(m.dispatcher.sent.sum() - m.dispatcher.sent[me],
                                       m.dispatcher.received.sum() - m.dispatcher.received[me],
                                       cfg.d_model, 4, EXPERTS, EP) for m in layers)
        counted = model.communication_stats()[("ep", "all_to_all")]["bytes"]
        return np.bincount(ranks, minlength=EP + 1)[1:], (counted, formula)
    results = run_threads(EP, step)
    return sum(r[0] for r in results), [r[1] for r in results]


def main():
    task = AdditionTask(digits=2, seed=0)
    tokens = BATCH // EP * task.block_size
    print(f"E={EXPERTS}, top-{TOP_K}, ep={EP}: tokens reaching 1, 2, 3, 4 ranks (mean) | rank 0's all-to-all "
          f"bytes | the mean rank's, and the planner's")
    data = {}
    for limit in (None, 3, 2, 1):
        reach, bytes_per_rank = one_step(task, limit)
        (counted, formula), mean = bytes_per_rank[0], np.mean([c for c, _ in bytes_per_rank])
        planner = balanced_all_to_all_bytes(config(task, limit), tokens, EP, max_ranks=limit)
        data[limit or EP] = reach, mean
        print(f"M={limit or EP}: {reach.tolist()} ({reach @ np.arange(1, EP + 1) / reach.sum():.2f}) | counted "
              f"{counted:,}, formula {formula:,} ({'equal' if counted == formula else 'DIFFERENT'}) | "
              f"{mean:,.0f}, planner {planner:,}")
    return data


if __name__ == "__main__":
    main()
