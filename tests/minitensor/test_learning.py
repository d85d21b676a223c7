"""The engine learns: a small GPT trained with AdamW solves 2-digit addition.

A fixed seed and a fixed number of steps (never a wall-clock bound). With this seed
the loss sits near 1.5 (guessing digits) for ~200 steps, then falls below 0.25 by
step 450-500 as the model finds the carry; the bound below leaves room for the
trajectory to shift a little with the BLAS build.
"""
import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask, exact_match
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW

STEPS = 500
FINAL_LOSS = 0.5  # mean loss of the last 20 steps must be below this
START_LOSS = 1.3  # ... after starting above this (ln 12 ≈ 2.48 at init)


def test_a_small_gpt_learns_two_digit_addition():
    task = AdditionTask(digits=2, seed=0)
    mt.manual_seed(0)
    model = GPT(GPTConfig(task.vocab_size, task.block_size, n_layer=2, n_head=4, d_model=64))
    optimizer = AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    generator = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        idx, targets = task.get_batch(64, generator=generator)
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[:20]) > START_LOSS
    assert np.mean(losses[-20:]) < FINAL_LOSS, f"loss still {np.mean(losses[-20:]):.3f} after {STEPS} steps"
    assert exact_match(model, task, num_problems=200) > 0.5  # held-out problems: it generalizes
