"""The 3D hybrid model against one device: the runs and checks shared by the threads tests
(tests/parallel/hybrid/test_hybrid.py) and the mpiexec worker (hybrid_equivalence.py).

A run makes `steps` optimizer steps; each accumulates `accumulate` global batches. The
hybrid run gathers, on every rank, the global loss of every batch, the single-device-named
gradients of every step (after the sync) and the parameters after every AdamW step.
The reference trains the dense float64 GPT on one device: the mean loss of the
accumulated batches, then one AdamW step. A BertConfig makes the model a BERT and the
batches MLM batches (data.mlm's rule: masked inputs, labels -100 outside the chosen positions).
"""
import numpy as np

import minitensor as mt
from minitensor.data.mlm import mask_tokens
from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPT, GPTConfig, use_attention
from minitensor.nn.attention_kernels import DENSE
from minitensor.optim import AdamW
from parallel import HybridGPT, Mesh

from helpers import assert_close

LR, WEIGHT_DECAY = 1e-2, 0.1


def make_batches(seed, config, batch, seq, count):
    rng = np.random.default_rng(seed)
    shape = (batch, seq)
    if isinstance(config, BertConfig):  # mask id: the last token; 30% of each row labelled
        return [mask_tokens(rng.integers(0, config.vocab_size - 1, shape), rng, config.vocab_size - 1,
                            np.ones(shape, bool), np.arange(config.vocab_size - 1), mask_prob=0.3)
                for _ in range(count)]
    return [(rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape))
            for _ in range(count)]


def make_model(config, seed):
    mt.manual_seed(seed)
    return (BERT if isinstance(config, BertConfig) else GPT)(config).double()


def run_single(config, seed, batches, accumulate):
    """Per optimizer step: ([loss of each batch], {name: grad}, {name: param after the step})."""
    model = make_model(config, seed)
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    history = []
    for start in range(0, len(batches), accumulate):
        optimizer.zero_grad()
        losses = []
        for idx, targets in batches[start:start + accumulate]:
            _, loss = model(idx, targets)
            (loss / accumulate).backward()
            losses.append(loss.item())
        grads = {name: p.grad.copy() for name, p in model.named_parameters()}
        optimizer.step()
        history.append((losses, grads, model.state_dict()))
    return history


def run_hybrid(layout, config, seed, batches, accumulate):
    """The same steps on this rank's part of the 3D (4D) model; the layout is a dict of
    dp, tp, pp, microbatches, schedule, chunks, sequence_parallel, recompute_activations, zero
    (and optionally cp, cp_layout, and `attention`: the kernel the model computes attention with)."""
    layout = dict(layout)
    mesh = Mesh(layout.pop("dp"), layout.pop("tp"), layout.pop("pp"), layout.pop("cp", 1))
    model = HybridGPT(use_attention(make_model(config, seed), layout.pop("attention", DENSE)), mesh, **layout)
    model.configure_optimizer(lr=LR, weight_decay=WEIGHT_DECAY)
    history = []
    for start in range(0, len(batches), accumulate):
        losses = [model.train_step(idx, targets) for idx, targets in batches[start:start + accumulate]]
        grads = model.full_grads()
        model.optimizer_step()
        history.append((losses, grads, model.full_state_dict()))
    return history


def check_against_single(history, ref):
    assert len(history) == len(ref)
    for step, ((losses, grads, params), (ref_losses, ref_grads, ref_params)) in enumerate(zip(history, ref)):
        assert_close(losses, ref_losses, f"losses of step {step}")
        assert list(grads) == list(ref_grads) and list(params) == list(ref_params)
        for name in ref_grads:
            assert_close(grads[name], ref_grads[name], f"gradient of {name} at step {step}")
            assert_close(params[name], ref_params[name], f"{name} after step {step}")


def tiny_config(layout, n_layer=None, vocab_size=11, heads_per_rank=1, head_dim=4, config_class=GPTConfig):
    """A small GPT (or BERT) that fits the layout: tp divides the heads, every stage gets a block."""
    n_head = layout["tp"] * heads_per_rank
    return config_class(vocab_size=vocab_size, block_size=8, n_layer=n_layer or layout["pp"] * layout.get("chunks", 1),
                     n_head=n_head, d_model=n_head * head_dim)
