"""Measure the per-part costs the step simulation (simulate.py) replays, on this machine.

One tp rank of a Megatron-split GPT computes, per block, the same kernels as a dense block
with n_head/tp heads of the same width and an MLP of width 4h/tp (the LayerNorms and the
residual stream stay whole); its head is an lm_head over V/tp (padded) words. So the local
work of any tp is a dense minitensor model of those sizes (GPTConfig's d_head and d_ff),
timed forward and backward part by part: the embedding, one block, the head with its loss,
and an AdamW step per parameter. Run it on every rank at once (as the validation does) and
the times include what the ranks sharing the cores cost each other.
"""
import time

import numpy as np

import minitensor as mt
from minitensor.models import gpt as dense
from minitensor.tensor import Tensor

from ..tensor_parallel.sharding import padded_size
from .simulate import PartCosts


def local_config(config, tp):
    """The dense config whose parts compute what one of tp ranks computes."""
    a, h = config.n_head, config.d_model
    return dense.GPTConfig(vocab_size=padded_size(config.vocab_size, tp) // tp, block_size=config.block_size,
                           n_layer=1, n_head=a // tp, d_model=h, d_head=h // a, d_ff=4 * h // tp)


def forward_backward(forward, repeats):
    """Median (forward, backward) seconds; forward() returns the tensor to backpropagate."""
    times = []
    for _ in range(repeats + 1):                     # the first is a warm-up
        start = time.perf_counter()
        out = forward()
        middle = time.perf_counter()
        out.backward(np.ones_like(out.data) if out.size > 1 else None)
        times.append((middle - start, time.perf_counter() - middle))
    return tuple(float(np.median(column)) for column in zip(*times[1:]))


def measure_parts(config, b, tp, dtype=np.float32, repeats=3):
    """PartCosts of one micro-batch of b sequences on one rank of tp (see the module doc)."""
    local = local_config(config, tp)
    mt.manual_seed(0)
    model = dense.GPT(local, dtype=dtype)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, local.vocab_size, (b, config.block_size))
    hidden = lambda: Tensor(rng.standard_normal((b, config.block_size, config.d_model)).astype(dtype),  # noqa: E731
                            requires_grad=True)
    embed = forward_backward(lambda: model.embed(idx), repeats)
    block = forward_backward(lambda: model.blocks[0](hidden()), repeats)
    head = forward_backward(lambda: model.head(hidden(), idx)[1], repeats)
    optimizer = mt.optim.AdamW(model.parameters())
    params = list(model.parameters())
    for p in params:
        p.grad = np.ones_like(p.data)
    seconds = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    count = sum(p.data.size for p in params)
    return PartCosts(embed, block, head, float(np.median(seconds[1:])) / count)
