"""Memory: backward frees what forward saved, and training does not accumulate objects."""
import gc
import weakref

import numpy as np

import minitensor as mt
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW


def live_tensors():
    gc.collect()
    return sum(isinstance(o, mt.Tensor) for o in gc.get_objects())


def test_a_training_loop_holds_no_growing_number_of_tensors():
    before = live_tensors()
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, d_model=8, dropout=0.1))
    optimizer = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)

    def train(steps):
        for _ in range(steps):
            idx = rng.integers(0, 7, size=(2, 6))
            _, loss = model(idx, np.roll(idx, -1, axis=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    train(3)
    after_n = live_tensors()
    train(3)
    assert live_tensors() == after_n
    assert after_n - before <= len(model.parameters()) + 2  # the parameters (and the last loss), no graph


def test_saved_activations_are_released_after_backward():
    x = mt.tensor(np.random.default_rng(0).standard_normal((4, 5)), requires_grad=True)
    hidden = mt.unary_ops.gelu(x @ x.T)
    loss = hidden.tanh().sum()
    nodes = [weakref.ref(loss._node), weakref.ref(hidden._node)]
    saved = [weakref.ref(a) for a in hidden._node.saved]  # the gelu input and its tanh, kept for backward
    del hidden
    loss.backward()
    gc.collect()
    assert all(r() is None for r in nodes + saved)


def test_retain_graph_keeps_the_saved_activations():
    x = mt.tensor(np.ones((2, 2)), requires_grad=True)
    loss = mt.unary_ops.gelu(x).sum()
    node = weakref.ref(loss._node.inputs[0]._node)
    loss.backward(retain_graph=True)
    gc.collect()
    assert node() is not None and node().saved
