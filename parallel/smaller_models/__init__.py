"""Make the addition GPT smaller and measure what it costs: pruning and distillation.

    python -m parallel.smaller_models prune   [--sparsity 0.5 0.75 0.9] [--finetune-steps N] ...
    python -m parallel.smaller_models distill [--seeds 0 1 2] [--steps N] [--alpha A] [--temperature T] ...

Both start from the teacher: the 2-digit addition GPT trained once on one device (cached
in the system's temporary directory, keyed by its settings). Every run is a pure
function of its seeds: batches come from (seed, step), as in `parallel.train`.
The mechanisms themselves are `minitensor.prune` and `minitensor.distill`; this module
only runs the experiments and prints their progress and tables. (Named for what it makes,
not "compress": in this project compression means only gradient compression, the
communication hooks of parallel.data_parallel.comm_hooks and `parallel.train --compress`.)
"""
import copy
import hashlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask, exact_match
from minitensor.distill import distillation_loss, teacher_logits
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW
from minitensor.prune import MagnitudePruner, prune_heads, prune_neurons, units_to_prune

DIGITS = 2
TEACHER = dict(n_layer=2, n_head=4, d_model=64)
STUDENT = dict(n_layer=2, n_head=4, d_model=28)  # 0.20 of the teacher's parameters
BATCH, LR = 64, 3e-3


def task():
    return AdditionTask(digits=DIGITS, seed=0)


def gpt(sizes, seed):
    t = task()
    mt.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=t.vocab_size, block_size=t.block_size, **sizes))


def train(model, steps, seed, loss_of=None, after_step=None, lr=LR, log=None):
    """AdamW, linear warm-up over steps/10 then cosine decay to 0; batch s from (seed, s).
    loss_of(model, idx, targets) -> loss (default: the model's cross-entropy); after_step():
    after every optimizer step (a pruning mask); log(step, loss): a progress line, 5 per run."""
    t = task()
    optimizer = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    model.train()
    for step in range(1, steps + 1):
        optimizer.defaults["lr"] = lr * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        idx, targets = t.get_batch(BATCH, generator=np.random.default_rng([seed, step]))
        loss = loss_of(model, idx, targets) if loss_of else model(idx, targets)[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if after_step:
            after_step()
        if log and (step % max(1, steps // 5) == 0 or step == steps):
            log(step, loss.item())
    return model.eval()


def trained_teacher(steps, seed=0, log=None):
    """The teacher GPT after `steps` training steps (cached in the temporary directory)."""
    key = hashlib.sha1(json.dumps([TEACHER, DIGITS, BATCH, LR, steps, seed]).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"minitensor_smaller_models_teacher_{key}.npz"
    model = gpt(TEACHER, seed)
    if cache.exists():
        model.load_state_dict(dict(np.load(cache)))
        return model.eval()
    train(model, steps, seed, log=log)
    np.savez(cache, **model.state_dict())
    return model


def prune_experiment(teacher, sparsities, finetune_steps, problems, seed=1, tp=2, log=None):
    """Rows (what, parameters kept, sparsity reached, exact match pruned, after fine-tuning):
    the dense teacher fine-tuned alike (the control), magnitude pruning (global) at each
    sparsity with its mask re-applied, and half the heads and neurons removed (tp rule)."""
    t, lr = task(), LR / 3
    rows = []

    def finish(what, model, kept, reached, after_step=None):
        before = exact_match(model, t, problems)
        train(model, finetune_steps, seed, after_step=after_step, lr=lr, log=log and (lambda s, v: log(what, s, v)))
        rows.append((what, kept, reached, before, exact_match(model, t, problems)))

    finish("dense (control)", copy.deepcopy(teacher), teacher.num_parameters(), 0.0)
    for sparsity in sparsities:
        model = copy.deepcopy(teacher)
        pruner = MagnitudePruner(model, sparsity, scope="global")
        zeros = sum(int((~m).sum()) for m in pruner.masks.values())
        finish(f"magnitude {sparsity:.0%}", model, model.num_parameters() - zeros, pruner.sparsity(), pruner.apply)
    model = copy.deepcopy(teacher)
    prune_heads(model, units_to_prune(model, "heads", model.config.n_head // 2, tp))
    prune_neurons(model, units_to_prune(model, "neurons", model.config.mlp_width // 2, tp))
    finish("structured: 1/2 heads + neurons", model, model.num_parameters(), 0.0)
    return rows


def distill_experiment(teacher, seeds, steps, problems, alpha, temperature, student=STUDENT, log=None):
    """{seed: (exact match trained alone, exact match distilled)} of the `student` sizes, same steps."""
    t = task()

    def distill_loss(student, idx, targets):
        return distillation_loss(student(idx)[0], teacher_logits(teacher, idx), targets, alpha, temperature)

    results = {}
    for seed in seeds:
        alone = train(gpt(student, seed), steps, seed, log=log and (lambda s, v: log(f"seed {seed} alone", s, v)))
        taught = train(gpt(student, seed), steps, seed, loss_of=distill_loss,
                       log=log and (lambda s, v: log(f"seed {seed} distilled", s, v)))
        results[seed] = (exact_match(alone, t, problems), exact_match(taught, t, problems))
    return results
