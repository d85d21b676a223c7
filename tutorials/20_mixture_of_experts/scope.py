"""Chapter 20: the balancing loss over each sequence (DeepSeek-V3's sequence-wise loss) or over
the whole batch (Switch's), on a batch of two "domains": the same sums, half of the sequences
written in another alphabet (a fixed permutation of the vocabulary). Same seed, same batches;
each run prints, over the last half of the steps and both MoE layers, the mean MaxVio of one
sequence's load and of the batch's, how far apart the two domains' expert loads are (total
variation: 0 the same experts, 1 disjoint ones), and the task's loss over the last 20 steps.

    python tutorials/20_mixture_of_experts/scope.py [--steps 120] [--alpha 0.1] [--seed 0]
"""
import argparse

import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask
from minitensor.models.gpt import GPT
from minitensor.nn.moe import MoE
from minitensor.nn.moe_balance import max_violation
from minitensor.optim import AdamW

from balance import EXPERTS, config  # the same DeepSeek-V3 routing: 8 fine-grained experts, top-2, sigmoid

BATCH = 32


def two_domains(task, rng, permutation):
    """A batch whose second half is written through `permutation` (targets: -100 stays -100)."""
    idx, targets = task.get_batch(BATCH, generator=rng)
    half = BATCH // 2
    idx[half:] = permutation[idx[half:]]
    targets[half:] = np.where(targets[half:] >= 0, permutation[np.maximum(targets[half:], 0)], targets[half:])
    return idx, targets


def loads_by_sequence(layer, sequences):
    """(sequences, E): how many of each sequence's assignments chose each expert."""
    chosen = layer.chosen.reshape(sequences, -1)
    return np.stack([np.bincount(row, minlength=EXPERTS) for row in chosen])


def measures(per_sequence):
    """(MaxVio of one sequence, of the batch, total variation between the two domains' loads)."""
    half = len(per_sequence) // 2
    first, second = (part.sum(0) / part.sum() for part in (per_sequence[:half], per_sequence[half:]))
    return (np.mean([max_violation(row) for row in per_sequence]), max_violation(per_sequence.sum(0)),
            0.5 * np.abs(first - second).sum())


def train(task, steps, alpha, scope, seed=0):
    """(loads (steps, MoE layers, sequences, E): each step's `loads_by_sequence` of every MoE
    layer, task losses (steps,))."""
    mt.manual_seed(seed)
    model = GPT(config(task, aux_loss_coef=alpha, aux_loss_scope=scope))
    layers = [block.mlp for block in model.blocks if isinstance(block.mlp, MoE)]
    optimizer, rng = AdamW(model.parameters(), lr=3e-3), np.random.default_rng(seed)
    permutation = np.random.default_rng(1).permutation(task.vocab_size)
    loads, losses = [], []
    for _ in range(steps):
        model.zero_grad()
        _, loss = model(*two_domains(task, rng, permutation))
        loss.backward()
        optimizer.step()
        loads.append([loads_by_sequence(layer, BATCH) for layer in layers])
        losses.append(loss.item() - sum(layer.aux_loss.item() for layer in layers))  # the task's part
    return np.array(loads), np.array(losses)


def measured(loads):
    """(steps, 3): each step's `measures`, the mean over the MoE layers."""
    return np.array([np.mean([measures(layer) for layer in step], axis=0) for step in loads])


def main(argv=None):
    """{run: (the measures it prints, its loads from `train`)}: the picture draws the loads."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--alpha", type=float, default=0.1, help="the balancing loss's α")
    parser.add_argument("--seed", type=int, default=0, help="the weights' and the batches' seed")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps={args.steps} must be ≥ 2")
    task = AdditionTask(digits=2, seed=0)
    results = {}
    for name, alpha, scope in (("no balancing", 0.0, "sequence"), (f"sequence α={args.alpha:g}", args.alpha, "sequence"),
                               (f"batch α={args.alpha:g}", args.alpha, "batch")):
        loads, losses = train(task, args.steps, alpha, scope, args.seed)
        last = measured(loads)[args.steps // 2:].mean(axis=0)
        results[name] = last, loads
        print(f"{name:16s} MaxVio per sequence {last[0]:.3f}  per batch {last[1]:.3f}  "
              f"domains apart {last[2]:.3f}  loss {losses[-20:].mean():.4f}")
    return results


if __name__ == "__main__":
    main()
