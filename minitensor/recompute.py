"""Activation recomputation: trade compute for memory by recomputing a region in backward.

    y = recompute(block, x)           # same value and gradients as y = block(x)

PyTorch calls this `torch.utils.checkpoint.checkpoint` ("activation checkpointing");
here the word checkpoint means only saved training state (`parallel.checkpoint`,
`--save/--resume`), so the mechanism takes Megatron-LM's word for it: recompute
(`--recompute-activations`).

Forward runs `fn` under `no_grad`, so none of its intermediate activations are kept:
the graph holds one node that remembers only the inputs. When backward reaches that
node it runs `fn` again, this time recording a graph, and backpropagates the incoming
gradient through the recomputed graph (Chen et al. 2016, "Training deep nets with
sublinear memory cost"; GPipe's re-materialisation). Parameters used inside `fn`
receive their gradients from that inner backward, so — as in PyTorch's non-reentrant
variant — the output joins the graph whenever grad mode is on, even if no input
requires a gradient.

Dropout must draw the same mask twice. The random state is saved before the forward
and restored around the recomputation (then put back, so the draws that follow are
untouched): this thread's default generator always, plus any `generators=` given.

`minitensor.graph.totals(y)["saved_bytes"]` shows what it saves.
"""
import numpy as np

from minitensor import autograd, dtypes
from minitensor.autograd import enable_grad, no_grad
from minitensor.random import default_generator
from minitensor.tensor import Tensor


class Recompute(autograd.Function):
    """The single node a recomputed region leaves in the graph."""

    def backward(self, grad):
        inputs = [Tensor(t.data, requires_grad=t.requires_grad) for t in self.inputs]
        args = iter(inputs)
        call_args = [next(args) if isinstance(a, Tensor) else a for a in self.args]
        with _replayed(self.rng_states), enable_grad():
            out = self.fn(*call_args)
        _check_output(out, self.fn)
        if out.requires_grad:
            out.backward(grad)
        return tuple(t.grad if t.requires_grad else None for t in inputs)


def recompute(fn, *args, generators=()):
    """`fn(*args)` without storing its activations; they are recomputed in backward.

    `fn` must return one Tensor. Tensor arguments are the region's inputs (gradients
    flow to those that require them); other arguments (index arrays, targets) are
    passed through unchanged.
    """
    rng_states = [(g, g.bit_generator.state) for g in (default_generator(), *generators)]
    with no_grad():
        out = fn(*args)
    _check_output(out, fn)
    if not autograd.is_grad_enabled():
        return out
    node = Recompute()
    node.fn, node.args, node.rng_states = fn, args, rng_states
    node.inputs = tuple(a for a in args if isinstance(a, Tensor))
    values = (a.data if isinstance(a, Tensor) else a for a in args)
    node.save_for_backward(*(a for a in values if isinstance(a, np.ndarray)))  # all the region keeps
    result = Tensor(out.data, requires_grad=dtypes.is_floating(out.dtype))
    if result.requires_grad:
        result._node = node
    return result


class _replayed:
    """Context: generators set to the saved states; their current states restored on exit."""

    def __init__(self, rng_states):
        self.rng_states = rng_states

    def __enter__(self):
        self.current = [g.bit_generator.state for g, _ in self.rng_states]
        for g, state in self.rng_states:
            g.bit_generator.state = state

    def __exit__(self, *exc):
        for (g, _), state in zip(self.rng_states, self.current):
            g.bit_generator.state = state
        return False


def _check_output(out, fn):
    if not isinstance(out, Tensor):
        raise TypeError(f"recompute: {getattr(fn, '__name__', type(fn).__name__)} must return one Tensor, "
                        f"got {type(out).__name__}")

