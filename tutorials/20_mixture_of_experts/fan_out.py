"""Chapter 20: device-limited routing caps how many ranks a token's rows reach. One training
step of HybridGPT at dp = ep = 4 (E = 8, top-4: 2 experts per rank), without a limit and with
at most M = 3 and 2 ranks per token; per M: how many tokens reach 1, 2, 3, 4 ranks (the first
MoE layer, all ranks), and the all-to-all bytes rank 0 counted against the formula.

    python tutorials/20_mixture_of_experts/fan_out.py
"""
import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask
from minitensor.models.gpt import GPT, GPTConfig
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh
from parallel.plan.moe import all_to_all_bytes

EXPERTS, TOP_K, EP = 8, 4, 4


def config(task, limit):
    return GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=2, n_head=4, d_model=32,
                     n_experts=EXPERTS, top_k=TOP_K, expert_groups=EP, max_groups_per_token=limit)


def one_step(task, limit):
    """(tokens reaching r = 1..EP ranks, summed over the ranks; rank 0's (counted, formula) bytes)."""
    idx, targets = task.get_batch(32, generator=np.random.default_rng(1))
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
    return sum(r[0] for r in results), results[0][1]


def main():
    task = AdditionTask(digits=2, seed=0)
    print(f"E={EXPERTS}, top-{TOP_K}, ep={EP}: tokens reaching 1, 2, 3, 4 ranks | rank 0's all-to-all bytes")
    data = {}
    for limit in (None, 3, 2):
        reach, (counted, formula) = one_step(task, limit)
        data[limit] = reach
        print(f"M={limit or EP}: {reach.tolist()} | counted {counted:,}, formula {formula:,} "
              f"({'equal' if counted == formula else 'DIFFERENT'})")
    return data


if __name__ == "__main__":
    main()
