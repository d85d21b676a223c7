"""Chapter 11, part 1: a backward in two halves, B (input gradient) and W (weight gradient).

    python tutorials/11_zero_bubble/split_by_hand.py

Prints: for one Linear y = x·Wᵀ + b, the products of its backward computed by hand next
to the engine's, the split backward (x.grad after B while W.grad is still empty, then W),
and the FLOPs of F, B and W; then a whole GPT: which nodes defer their weight products
and which compute them in B, the bytes a micro-batch keeps from its B to its W, and the
split gradients against one ordinary backward.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from collections import Counter

import numpy as np

import minitensor as mt
import minitensor.nn.functional as F
from minitensor.models import GPT, GPTConfig
from minitensor.nn.module import Parameter
from minitensor.split_backward import backward_input
from parallel.pipeline.memory import activation_bytes

CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, d_model=64)
ROWS, IN, OUT = 4, 3, 2


def one_linear():
    rng = np.random.default_rng(0)
    x_data, w_data, b_data, dy = (rng.standard_normal(s) for s in ((ROWS, IN), (OUT, IN), (OUT,), (ROWS, OUT)))

    def fresh():
        return mt.Tensor(x_data, requires_grad=True), Parameter(w_data), Parameter(b_data)

    x, w, b = fresh()
    F.linear(x, w, b).backward(dy)
    by_hand = {"dx = dy·W": dy @ w_data, "dW = dyᵀ·x": dy.T @ x_data, "db = Σ dy": dy.sum(axis=0)}
    print(f"one Linear, x {x_data.shape}, W {w_data.shape}:")
    for (name, value), grad in zip(by_hand.items(), (x.grad, w.grad, b.grad)):
        print(f"  {name:<11} by hand vs engine, largest difference: {np.abs(value - grad).max():.1e}")

    full = (x.grad, w.grad, b.grad)
    x, w, b = fresh()
    weights = backward_input(F.linear(x, w, b), dy, inputs=[x])
    print(f"  after B: x.grad set: {x.grad is not None}, W.grad set: {w.grad is not None}, "
          f"b.grad set: {b.grad is not None}")
    weights()
    split = (x.grad, w.grad, b.grad)
    print(f"  after W: B then W vs backward, largest difference: "
          f"{max(np.abs(s - f).max() for s, f in zip(split, full)):.1e}")
    flops = 2 * ROWS * IN * OUT  # each of the three is one (rows x in x out) product
    print(f"  flops F (x·Wᵀ), B (dy·W), W (dyᵀ·x): {flops}, {flops}, {flops}")


def gpt_loss(seed=0):
    mt.manual_seed(seed)
    model = GPT(CONFIG).double()
    idx = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (2, CONFIG.block_size))
    return model, model(idx, idx)[1]


def whole_gpt():
    model, loss = gpt_loss()
    loss.backward()
    full = {name: p.grad for name, p in model.named_parameters()}

    model, loss = gpt_loss()
    saved = activation_bytes(loss)
    weights = backward_input(loss)
    kept = weights.saved_bytes()
    dy = sum({id(grad): grad.nbytes for _, _, grad, _ in weights.parts if grad is not None}.values())
    deferred = Counter(node.name for node, _, grad, _ in weights.parts if grad is not None)
    in_b = Counter(node.name for node, _, grad, _ in weights.parts if grad is None)
    print(f"\na GPT {CONFIG.n_layer} blocks, d_model {CONFIG.d_model}, {sum(p.size for p in model.parameters()):,} "
          f"parameters:")
    print(f"  nodes whose weight products wait for W: {dict(deferred)}")
    print(f"  nodes that compute their weight gradients in B (they wait, done): {dict(in_b)}")
    print(f"  parameters with a gradient after B: {sum(p.grad is not None for p in model.parameters())}")
    print(f"  bytes saved for backward: {saved:,}; kept from B to W: {kept:,} (of which the waiting "
          f"nodes' output gradients dy: {dy:,})")
    weights()
    diff = max(np.abs(p.grad - full[name]).max() for name, p in model.named_parameters())
    print(f"  B then W vs backward on the GPT, largest difference: {diff:.1e}")


if __name__ == "__main__":
    one_linear()
    whole_gpt()
