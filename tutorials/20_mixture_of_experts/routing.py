"""Chapter 20's evidence: tokens per expert with and without the balancing loss (and with the
router frozen at its initial weights), and the dispatch all-to-all of one step as a grid of
who sends how many rows to whom.

    python tutorials/20_mixture_of_experts/routing.py [--steps 60]
"""
import argparse

import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask
from minitensor.flags import AT_LEAST_1, parse_checked
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh

EXPERTS, EP = 4, 4


def config(task, aux):
    return GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=2, n_head=4, d_model=32,
                     n_experts=EXPERTS, top_k=1, aux_loss_coef=aux)


def loads(aux, steps, task, train_router=True):
    """Tokens per expert of the first MoE layer, summed over each 10 steps: (steps // 10, E)."""
    mt.manual_seed(0)
    model = GPT(config(task, aux))
    trained = [p for name, p in model.named_parameters() if train_router or "router" not in name]
    optimizer, rng, windows = AdamW(trained, lr=3e-3), np.random.default_rng(0), np.zeros((steps // 10, EXPERTS), int)
    for step in range(steps // 10 * 10):
        model.zero_grad()
        model(*task.get_batch(32, generator=rng))[1].backward()
        optimizer.step()
        windows[step // 10] += model.blocks[0].mlp.load
    return windows


def dispatch_grid(task):
    """grid[r, s]: rows rank r sends rank s in the first MoE layer's dispatch (ep = dp = EP)."""
    idx, targets = task.get_batch(32, generator=np.random.default_rng(1))

    def step():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config(task, 0.01)), Mesh(EP, ep=EP))
        model.train_step(idx, targets)
        return model.moe_layers()[0].dispatcher.sent
    return np.array(run_threads(EP, step))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    args = parse_checked(parser, argv, {"steps": AT_LEAST_1})
    task = AdditionTask(digits=2, seed=0)
    print("max/mean tokens per expert of each 10 steps; then the last 10 steps' tokens per expert")
    for aux, train_router in ((0.0, True), (0.0, False), (0.01, True)):
        windows = loads(aux, args.steps, task, train_router)
        ratios = " ".join(f"{w.max() / w.mean():.2f}" for w in windows)
        print(f"balancing loss α={aux}{'' if train_router else ', router frozen'}: max/mean {ratios} | "
              f"{windows[-1].tolist()}")
    grid = dispatch_grid(task)
    print(f"dispatch all-to-all, rows from rank (row) to rank (column), ep={EP}:")
    print("\n".join("  " + " ".join(f"{n:4d}" for n in row) for row in grid))
    print(f"rows that cross ranks: {grid.sum() - np.trace(grid)} of {grid.sum()}")
    return grid


if __name__ == "__main__":
    main()
