"""x += y, -=, *=, /= (minitensor.inplace) and the version counter (minitensor.versions)."""
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
from tests.strategies import broadcastable_pairs

IN_PLACE = {"+=": (operator.iadd, np.add), "-=": (operator.isub, np.subtract),
            "*=": (operator.imul, np.multiply), "/=": (operator.itruediv, np.divide)}


@settings(max_examples=30, deadline=None)
@given(broadcastable_pairs, st.sampled_from(sorted(IN_PLACE)), st.booleans())
def test_in_place_writes_the_out_of_place_result_into_the_same_array(shapes, symbol, under_no_grad):
    (x_shape, y_shape), result_shape = shapes.input_shapes, shapes.result_shape
    if result_shape != x_shape:  # x cannot grow: refused, PyTorch's rule
        x_shape = result_shape
    rng = np.random.default_rng(0)
    x = mt.tensor(rng.uniform(1, 2, x_shape), dtype=mt.float64, requires_grad=under_no_grad)
    y = rng.uniform(1, 2, y_shape)
    array, expected = x.data, IN_PLACE[symbol][1](x.data, y)
    in_place = IN_PLACE[symbol][0]
    with mt.no_grad() if under_no_grad else mt.enable_grad():
        after = in_place(x, y)
    assert after is x and x.data is array and x._version == 1
    np.testing.assert_array_equal(x.data, expected)


def test_manual_sgd_step_lowers_the_loss():
    mt.manual_seed(0)
    lin, x = mt.nn.Linear(3, 1), mt.randn(16, 3)
    y = x @ mt.tensor([[1.0], [-2.0], [0.5]])
    losses = []
    for _ in range(5):
        loss = ((lin(x) - y) ** 2).mean()
        losses.append(loss.item())
        lin.zero_grad()
        loss.backward()
        with mt.no_grad():
            for p in lin.parameters():
                p -= 0.1 * p.grad
    assert all(b < a for a, b in zip(losses, losses[1:]))


@pytest.mark.parametrize("symbol", sorted(IN_PLACE))
def test_a_leaf_that_requires_grad_refuses_outside_no_grad(symbol):
    w = mt.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"leaf tensor that requires grad .*x \{symbol[0]}= y"):
        IN_PLACE[symbol][0](w, 1.0)
    np.testing.assert_array_equal(w.data, [1.0, 2.0])


def test_a_tensor_in_the_graph_takes_the_op_on_its_old_value():
    """h = 2a; h += 1; h *= 3: dh/da = 6, and the Mul keeps h's old array intact."""
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    h = a * 2
    h += 1
    h *= a
    h.sum().backward()
    np.testing.assert_array_equal(h.data, [3.0, 10.0])
    np.testing.assert_array_equal(a.grad, 4 * a.data + 1)  # d/da (2a+1)a


def test_a_saved_array_written_in_place_is_refused_at_backward():
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    b = mt.tensor([3.0, 4.0])
    loss = (a * b).sum()
    b += 1
    with pytest.raises(RuntimeError, match="Mul saved for backward was modified by an in-place operation"):
        loss.backward()


def test_a_saved_output_written_in_place_under_no_grad_is_refused():
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    e = a.exp()  # Exp saves its output
    with mt.no_grad():
        e *= 2
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        e.sum().backward()


def test_an_unsaved_array_written_in_place_does_not_stop_backward():
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    b = mt.tensor([3.0, 4.0])
    loss = (a + b).sum()  # Add saves nothing
    b += 1
    loss.backward()
    np.testing.assert_array_equal(a.grad, [1.0, 1.0])


@pytest.mark.parametrize("x, y, match", [
    (mt.tensor([1, 2]), 0.5, "float32 cannot be cast to x's dtype int64"),
    (mt.tensor([1.0, 2.0]), np.ones((3, 2), np.float32), r"has shape \(3, 2\) but x has shape \(2,\)"),
])
def test_results_that_do_not_fit_x_are_refused(x, y, match):
    with pytest.raises(RuntimeError, match=match):
        x += y


class InPlaceBlock(mt.nn.Module):
    def forward(self, x):
        y = x * 2
        y += 1
        y[0] = y[1] * 4  # an IndexPut on y's new node
        z = x * 1
        z *= y
        return z * 3


@pytest.mark.parametrize("grad", [False, True])
def test_a_trace_follows_in_place_ops_and_assignments_to_the_values_of_other_inputs(grad):
    """The graph reads the op's result wherever x is read next (autograd.rebound), not x's old node."""
    from minitensor.graph import trace
    with mt.enable_grad() if grad else mt.no_grad():
        graph = trace(InPlaceBlock(), mt.tensor([1.0, 1.5]))
    for values in ([1.0, 1.5], [2.0, 0.0], [-3.0, 0.25]):
        np.testing.assert_array_equal(graph(mt.tensor(values)).data, InPlaceBlock()(mt.tensor(values)).data)
