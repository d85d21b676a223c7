"""Tensor parallelism against one device: the runs and checks shared by the threads tests
(this folder) and the mpiexec worker (../mpi_scripts/tp_equivalence.py), so both
backends are held to exactly the same checks.

A run trains `len(batches)` AdamW steps. Every rank builds the same dense GPT from the
seed; the TP run converts it over `group` and runs a plain AdamW on its own shards.
Each step records the loss, the dense logits, every gradient by single-device name.
"""
import numpy as np
from helpers import assert_close

import minitensor as mt
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import TensorParallelGPT

LR, WEIGHT_DECAY = 1e-3, 0.1


def make_batches(config, batch, seq, steps, seed):
    """(idx, targets) per step; about one target in five is ignore_index (-100)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        idx = rng.integers(0, config["vocab_size"], (batch, seq))
        targets = rng.integers(0, config["vocab_size"], (batch, seq))
        targets[rng.random((batch, seq)) < 0.2] = -100
        batches.append((idx, targets))
    return batches


def dense_gpt(config, seed):
    mt.manual_seed(seed)
    return GPT(GPTConfig(**config)).double()


def train(model, batches, record_logits, record_grads, finish_grad_sync=lambda: None):
    """AdamW steps over `batches`; per step (loss, logits, grads) as the model reports them."""
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    records = []
    for idx, targets in batches:
        logits, loss = model(idx, targets)
        loss.backward()
        finish_grad_sync()
        records.append((loss.item(), record_logits(logits), record_grads()))
        optimizer.step()
        optimizer.zero_grad()
    return records


def run_dense(config, seed, batches):
    model = dense_gpt(config, seed)
    records = train(model, batches, lambda logits: logits.data.copy(),
                    lambda: {name: p.grad.copy() for name, p in model.named_parameters()})
    return records, model.state_dict()


def run_tensor_parallel(config, seed, batches, group, sequence_parallel, dropout_seed=0):
    """The same training on this rank's TP model: records, dense state dict, replicated params."""
    model = TensorParallelGPT(dense_gpt(config, seed), group, sequence_parallel=sequence_parallel,
                                seed=dropout_seed)
    records = train(model, batches, model.gather_logits, model.full_grads, model.finish_grad_sync)
    replicated = {name: p.data.copy() for name, p in model.named_parameters() if not hasattr(p, "tp_axis")}
    return records, model.full_state_dict(), replicated


def check_against_dense(tp_run, dense_run):
    """Loss, logits and every gradient of every step, and the parameters after the steps."""
    (tp_records, tp_state, _), (dense_records, dense_state) = tp_run, dense_run
    for step, ((loss, logits, grads), (ref_loss, ref_logits, ref_grads)) in enumerate(zip(tp_records, dense_records)):
        assert_close(loss, ref_loss, f"loss at step {step}")
        assert_close(logits, ref_logits, f"logits at step {step}")
        assert list(grads) == list(ref_grads)
        for name in ref_grads:
            assert_close(grads[name], ref_grads[name], f"gradient of {name} at step {step}")
    assert list(tp_state) == list(dense_state)
    for name in dense_state:
        assert_close(tp_state[name], dense_state[name], f"{name} after {len(dense_records)} AdamW steps")


def check_replicas_identical(replicated_by_rank):
    """Replicated parameters got identical gradients on every tp rank, so they are still identical."""
    first = replicated_by_rank[0]
    for rank, replicated in enumerate(replicated_by_rank[1:], start=1):
        assert list(replicated) == list(first)
        for name in first:
            np.testing.assert_array_equal(replicated[name], first[name], err_msg=f"{name} on rank {rank}")
