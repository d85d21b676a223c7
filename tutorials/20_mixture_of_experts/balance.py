"""Chapter 20's second half: balancing by the auxiliary loss against loss-free balancing (a bias
that only picks experts), on MaxVio and on the loss, with DeepSeek-V3's routing (sigmoid scores,
top-2 of 8 fine-grained experts and a shared one). Same seed, same batches; each run prints the
mean MaxVio of its MoE layers per step (all steps, then the last half) and the mean loss of the
last 20 steps.

    python tutorials/20_mixture_of_experts/balance.py [--steps 150] [--seed 0]
"""
import argparse

import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn.moe_balance import max_violation
from minitensor.optim import AdamW

EXPERTS = 8
RUNS = {"no balancing": dict(aux_loss_coef=0.0),
        "aux loss α=0.01": dict(aux_loss_coef=0.01),
        "loss-free γ=0.01": dict(aux_loss_coef=0.0, expert_bias_rate=0.01),
        "loss-free γ=0.03": dict(aux_loss_coef=0.0, expert_bias_rate=0.03)}


def config(task, **balancing):
    return GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=2, n_head=4, d_model=32,
                     n_experts=EXPERTS, top_k=2, expert_hidden=32, shared_experts=1, router_score="sigmoid",
                     **balancing)


def train(task, steps, seed=0, **balancing):
    """(loads (steps, layers, E): tokens per expert each step, losses (steps,))."""
    mt.manual_seed(seed)
    model = GPT(config(task, **balancing))
    optimizer, rng = AdamW(model.parameters(), lr=3e-3), np.random.default_rng(seed)
    updates = [update for module in model.modules() for update in module.step_updates()]
    loads, losses = [], []
    for _ in range(steps):
        model.zero_grad()
        _, loss = model(*task.get_batch(32, generator=rng))
        loss.backward()
        optimizer.step()
        loads.append([update.load.copy() for update in updates])
        for update in updates:  # the bias moves after the optimizer step
            update.after_step()
        losses.append(loss.item() - sum(block.mlp.aux_loss.item() for block in model.blocks))  # the task's part
    return np.array(loads), np.array(losses)


def max_violations(loads):
    """(steps,): MaxVio of each step, the mean over the MoE layers."""
    return np.array([np.mean([max_violation(layer) for layer in step]) for step in loads])


def random_router_floor(tokens=32 * 8, draws=2000, seed=0):
    """MaxVio of a router choosing 2 distinct experts uniformly at random for each of `tokens`
    tokens: the noise floor of one batch's MaxVio (perfect balance only in expectation)."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((draws, tokens, EXPERTS)), axis=-1)[..., :2].reshape(draws, -1)
    return float(np.mean([max_violation(np.bincount(p, minlength=EXPERTS)) for p in picks]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0, help="the weights' and the batches' seed")
    args = parser.parse_args(argv)
    task = AdditionTask(digits=2, seed=0)
    results = {}
    for name, balancing in RUNS.items():
        loads, losses = train(task, args.steps, args.seed, **balancing)
        vio = max_violations(loads)
        results[name] = loads
        print(f"{name:18s} MaxVio {vio.mean():.3f} (last half {vio[args.steps // 2:].mean():.3f})  "
              f"loss {losses[-20:].mean():.4f}")
    print(f"{'random router':18s} MaxVio {random_router_floor():.3f} (one batch's noise floor)")
    return results


if __name__ == "__main__":
    main()
