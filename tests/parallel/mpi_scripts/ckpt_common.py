"""Training runs shared by the checkpoint tests (threads) and their worker (subprocess, mpiexec).

The batch of step s is a pure function of s, so a resumed run sees the same data as an
uninterrupted one and only the checkpoint carries state across the interruption.
"""
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import HybridGPT, Mesh

CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=4, n_head=4, d_model=16)
LR, WEIGHT_DECAY, BATCH = 1e-2, 0.1, 8


def batch(step, config=CONFIG):
    rng = np.random.default_rng([1234, step])
    idx = rng.integers(0, config.vocab_size, (BATCH, config.block_size))
    return idx, rng.integers(0, config.vocab_size, idx.shape)


def dense_gpt(config=CONFIG, seed=0):
    mt.manual_seed(seed)
    return GPT(config, dtype=np.float64)


def hybrid(dp=1, tp=1, pp=1, zero=False, microbatches=2, config=CONFIG, cp=1, **layout):
    """This rank's HybridGPT with its AdamW / ZeRO optimizer, on the current world."""
    model = HybridGPT(dense_gpt(config), Mesh(dp, tp, pp, cp), microbatches=microbatches, zero=zero, **layout)
    model.configure_optimizer(lr=LR, weight_decay=WEIGHT_DECAY)
    return model


def train(model, steps, config=CONFIG):
    """The global mean loss of each step in `steps` (one optimizer step each)."""
    losses = []
    for step in steps:
        losses.append(model.train_step(*batch(step, config)))
        model.optimizer_step()
    return losses


def train_dense(steps, config=CONFIG, moment_dtype=None):
    """The single-device reference: the dense float64 GPT with AdamW (its moments in `moment_dtype`), from step 0."""
    model = dense_gpt(config)
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, moment_dtype=moment_dtype)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        _, loss = model(*batch(step, config))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
