"""Memory: backward frees what forward saved, forward keeps nothing else, training does not
accumulate objects, and the memory switches of minitensor.speed change no result."""
import contextlib
import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import minitensor as mt
from minitensor import graph, speed
from minitensor.autograd import topological_order
from minitensor.gradcheck import gradcheck
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW

MEMORY_SWITCHES = ("free_unsaved_activations", "gelu_saves_derivative")


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
    hidden = mt.unary_ops.gelu(x @ x.T, approximate="tanh")
    loss = hidden.tanh().sum()
    nodes = [weakref.ref(loss._node), weakref.ref(hidden._node)]
    saved = [weakref.ref(a) for a in hidden._node.saved]  # the gelu input and its tanh, kept for backward
    del hidden
    loss.backward()
    gc.collect()
    assert all(r() is None for r in nodes + saved)


def test_retain_graph_keeps_the_saved_activations():
    x = mt.tensor(np.ones((2, 2)), requires_grad=True)
    loss = mt.unary_ops.gelu(x, approximate="tanh").sum()
    node = weakref.ref(loss._node.inputs[0]._node)
    loss.backward(retain_graph=True)
    gc.collect()
    assert node() is not None and node().saved


def gpt_loss_and_gradients(dtype):
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=4, d_model=64, dropout=0.1), dtype=dtype)
    idx = np.random.default_rng(0).integers(0, 13, size=(4, 16))
    loss = model(idx, np.roll(idx, -1, axis=1))[1]
    loss.backward()
    return [loss.data] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("switch", MEMORY_SWITCHES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_memory_switch_changes_no_bit_of_the_loss_or_gradients(switch, dtype):
    lean = gpt_loss_and_gradients(dtype)
    with speed.disabled(switch):
        plain = gpt_loss_and_gradients(dtype)
    for a, b in zip(lean, plain, strict=True):
        np.testing.assert_array_equal(a, b)


def switch(name, on):
    return contextlib.nullcontext() if on else speed.disabled(name)


@pytest.mark.parametrize("free", [True, False])
def test_an_activation_no_backward_saved_lives_only_while_the_caller_holds_it(free):
    x = mt.tensor(np.ones((3, 4)), requires_grad=True)
    with switch("free_unsaved_activations", free):
        hidden = x.exp()           # Exp keeps its output: it is saved
        summed = hidden + hidden   # Add and Sum keep nothing
        values = weakref.ref(summed.data)
        loss = summed.sum()
        del summed
        gc.collect()
        assert (values() is None) == free  # held by the graph only with the switch off
        loss.backward()
    np.testing.assert_array_equal(x.grad, 2 * np.exp(np.ones((3, 4))))


def owner(array):
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def saved_activation_bytes(loss):
    """Bytes of the arrays the graph's nodes saved, each buffer once, parameters left out."""
    order = topological_order(loss)
    parameters = {id(owner(t.data)) for t in order if t._node is None}
    buffers = {id(owner(a)): owner(a) for t in order if t._node is not None
               for a in graph.saved_arrays(t._node) if id(owner(a)) not in parameters}
    return sum(a.nbytes for a in buffers.values())


@pytest.mark.parametrize("free", [True, False])
def test_after_forward_only_saved_arrays_and_the_outputs_are_alive(free):
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=4, d_model=64))
    idx = np.random.default_rng(0).integers(0, 13, size=(4, 16))
    targets = np.roll(idx, -1, axis=1)
    gc.collect()
    tracemalloc.start()
    try:
        with switch("free_unsaved_activations", free):
            logits, loss = model(idx, targets)
        numpy_arrays = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
        alive = sum(t.size for t in tracemalloc.take_snapshot().filter_traces([numpy_arrays]).traces)
    finally:
        tracemalloc.stop()
    held = saved_activation_bytes(loss) + logits.data.nbytes + loss.data.nbytes
    assert (alive <= held) == free, (alive, held)


@pytest.mark.parametrize("lean", [True, False])
def test_gelu_keeps_one_array_for_backward_instead_of_two(lean):
    x = mt.tensor(np.linspace(-3, 3, 12).reshape(3, 4), requires_grad=True)
    with switch("gelu_saves_derivative", lean):
        y = mt.unary_ops.gelu(x, approximate="tanh")
        assert [a.shape for a in graph.saved_arrays(y._node)] == [(3, 4)] * (1 if lean else 2)
        assert gradcheck(lambda t: mt.unary_ops.gelu(t, approximate="tanh"),
                         mt.tensor(x.data.astype(np.float64), requires_grad=True))
