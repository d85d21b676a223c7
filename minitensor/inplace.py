"""In-place arithmetic, `x += y`, `x -= y`, `x *= y`, `x /= y`, as PyTorch does it.

Outside the graph (under `no_grad`, or when neither side requires grad) the result is
written into x's array, so every view of it sees the update (a parameter inside an
optimizer's flat buffer: the manual SGD step `p -= lr * p.grad`), and x's version goes up
by one: a node that saved that array for backward then refuses at backward
(minitensor.versions) instead of differentiating at the new values.
In the graph (grad mode on and a side requires grad), and while a trace records, x becomes
the op's output on its old value, as `x[i] = v` does (indexing.setitem): what backward saved
stays intact, and the traced graph reads the op's result wherever x is read next.
A leaf that requires grad refuses outside `no_grad`: its gradient is taken at its value.
"""
import numpy as np

from minitensor import autograd, versions
from minitensor.tensor import Tensor


def _check_result(x, result, symbol):
    """The result keeps x's shape (no broadcasting x up) and casts to x's dtype within its kind."""
    if result.shape != x.shape:
        raise RuntimeError(f"x {symbol} y: the result has shape {result.shape} but x has shape {x.shape}; "
                           f"an in-place op cannot change x's shape")
    if not np.can_cast(result.dtype, x.dtype, "same_kind"):
        raise RuntimeError(f"x {symbol} y: the result's dtype {result.dtype} cannot be cast to x's dtype {x.dtype} "
                           f"in place; write x = x {symbol[0]} y")


def _in_place(op, symbol, name):
    def update(x, other):
        needs_graph = autograd.is_grad_enabled() and (
            x.requires_grad or (isinstance(other, Tensor) and other.requires_grad))
        if needs_graph and x.is_leaf and x.requires_grad:
            raise RuntimeError(f"a leaf tensor that requires grad is used in an in-place operation (x {symbol} y); "
                               f"update it inside mt.no_grad(), or use x = x {symbol[0]} y")
        if not needs_graph and not autograd.recording():
            result = op(x, other)
            _check_result(x, result, symbol)
            np.copyto(x.data, result.data, casting="same_kind")
            versions.bump(x)
            return x
        old = Tensor(x.data, requires_grad=x.requires_grad)
        old._place = x._place  # the old value keeps x's place in the graph; x takes the new one
        autograd.rebound(old, x)  # a trace records the op on x's node, and x as its result
        result = op(old, other)
        _check_result(x, result, symbol)
        result = result.to(x.dtype)
        x.data, x._place, x.requires_grad, x._version_counter = result.data, result._place, needs_graph or x.requires_grad, None
        autograd.rebound(x, result)
        return x
    update.__name__ = update.__qualname__ = name
    update.__doc__ = f"x {symbol} y: {op.__name__} in place (minitensor.inplace)."
    return update


def operators(add, sub, mul, div):
    """Tensor's in-place operators, built on its add, sub, mul, div (the methods table installs them)."""
    table = {"__iadd__": (add, "+="), "__isub__": (sub, "-="), "__imul__": (mul, "*="), "__itruediv__": (div, "/=")}
    return {name: _in_place(op, symbol, name) for name, (op, symbol) in table.items()}
