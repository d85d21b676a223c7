"""What a trace cannot capture, reported while tracing instead of found later in a wrong graph.

A graph holds ops; whatever Python does with a tensor's *value* is not an op, so a trace
keeps the outcome of this one run. Two cases are caught:

1. A traced tensor's value read into Python: `t.item()` or `t.numpy()` on a tensor computed
   from the inputs or the parameters. What Python decides with it (`if x.sum().item() > 0:`,
   a loop count, a mask built in numpy) would be frozen, and the graph would take this run's
   branch on every call. So the read raises TraceError naming the user's line, as torch.fx
   refuses ("symbolically traced variables cannot be used as inputs to control flow").
   Values the inputs do not decide (shapes, constants, config numbers) read as usual.
   `float(t)`, `int(t)`, `t > 0` and `bool(t)` of a 0-d tensor need no check: Tensor has no
   such conversions, so they fail in eager code too; `bool(t)` of a ≥ 1-d tensor is its
   length, a shape. `t.data` (numpy's view, which every op reads) cannot be watched.
2. Dropout in training mode: the masks drawn while tracing become constants, so every call
   of the graph drops the same units. A FrozenDropoutWarning names the Dropout modules.
"""
import contextlib
import functools
import sys
import threading
import traceback
import warnings

from minitensor.nn.layers import Dropout
from minitensor.tensor import Tensor

_tracing = threading.local()  # this thread's Recorder while a trace runs (traces are per thread)


class TraceError(ValueError):
    """A traced tensor's value was asked for in Python (torch.fx's TraceError)."""


class FrozenDropoutWarning(UserWarning):
    """A model traced in training mode: its dropout masks are frozen into the graph."""


@contextlib.contextmanager
def guarding(recorder):
    """Inside: reading the value of a tensor that `recorder.is_dynamic` raises TraceError."""
    _tracing.recorder = recorder
    try:
        yield
    finally:
        _tracing.recorder = None


def _message(method, frame):
    return (f"trace: {frame.filename}:{frame.lineno}: `{frame.line}` calls .{method}() on a tensor computed "
            f"from the traced inputs or parameters. A graph records ops, not Python: what Python decides with "
            f"this value (a branch, a loop count, a number) would be frozen at this run's value and the graph "
            f"would give the wrong result for other inputs (torch.fx refuses the same: symbolically traced "
            f"variables cannot be used as inputs to control flow). Compute it with ops, or decide outside the "
            f"traced function and trace one graph per case.")


def _guard(read):
    """`read`, a Tensor method handing the tensor's value to Python, refused on a traced value."""
    @functools.wraps(read)
    def guarded(self, *args, **kwargs):
        recorder = getattr(_tracing, "recorder", None)
        if recorder is not None and recorder.is_dynamic(self):
            caller = traceback.extract_stack(sys._getframe(1), limit=1)[0]  # the line that asked
            raise TraceError(_message(read.__name__, caller))
        return read(self, *args, **kwargs)
    return guarded


# minitensor.tensor knows nothing of tracing (graph sits above it), so the two Tensor methods
# that hand a value to Python are wrapped here, once; outside a trace the wrapper only looks
# up this thread's recorder (None) and calls the method.
Tensor.item, Tensor.numpy = _guard(Tensor.item), _guard(Tensor.numpy)


def warn_if_dropout(module):
    """Warn when `module` (None: not a Module) is in training mode with an active Dropout."""
    if module is None:
        return
    names = [name or type(m).__name__ for name, m in module.named_modules()
             if isinstance(m, Dropout) and m.training and m.p > 0]
    if names:
        warnings.warn(
            f"trace: {type(module).__name__} is in training mode with dropout ({', '.join(names)}): the masks "
            f"drawn while tracing become constants, so every call of the graph drops the same units. Call "
            f".eval() before tracing, or accept one fixed mask.", FrozenDropoutWarning, stacklevel=3)
