"""What a trace cannot capture, reported while tracing instead of found later in a wrong graph.

A graph holds ops; whatever Python does with a tensor's *value* is not an op, so a trace
keeps the outcome of this one run. Two cases are caught:

1. A traced tensor's value read into Python: `t.item()`, `t.numpy()`, `bool(t)`, `float(t)`,
   `int(t)` on a tensor computed from the inputs or the parameters (Tensor tells the
   recorder: autograd.value_read). What Python decides with it (`if x.sum() > 0:`, a loop
   count, a mask built in numpy) would be frozen, and the graph would take this run's
   branch on every call. So the read raises TraceError naming the user's line (the first
   outside minitensor), as torch.fx refuses ("symbolically traced variables cannot be
   used as inputs to control flow"). Comparisons are ops (minitensor.comparison), so
   `x.sum() > 0` is traced, and its `bool()` is refused. Values the inputs do not decide
   (shapes, constants, config numbers) read as usual. `t.data` (numpy's view, which
   every op reads) cannot be watched.
2. Dropout in training mode: the masks drawn while tracing become constants, so every call
   of the graph drops the same units. A FrozenDropoutWarning names the Dropout modules.
"""
import sys
import traceback
import warnings
from pathlib import Path

from minitensor.nn.layers import Dropout

ENGINE = Path(__file__).resolve().parents[1]  # the minitensor package: the user's line is the first outside it


class TraceError(ValueError):
    """A traced tensor's value was asked for in Python (torch.fx's TraceError)."""


class FrozenDropoutWarning(UserWarning):
    """A model traced in training mode: its dropout masks are frozen into the graph."""


def users_line():
    """The innermost frame of the stack outside minitensor: the line that asked for the value."""
    frame = sys._getframe(1)
    while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(ENGINE):
        frame = frame.f_back
    return traceback.extract_stack(frame, limit=1)[0] if frame is not None else None


def refuse_value_read(how):
    """The TraceError for `how` ("item", "bool", ...) of a traced value, naming the user's line."""
    line = users_line()
    where = f"{line.filename}:{line.lineno}: `{line.line}`" if line is not None else "a line"
    return TraceError(
        f"trace: {where} asks for {how}() of a tensor computed from the traced inputs or parameters. A graph "
        f"records ops, not Python: what Python decides with this value (a branch, a loop count, a number) would "
        f"be frozen at this run's value and the graph would give the wrong result for other inputs (torch.fx "
        f"refuses the same: symbolically traced variables cannot be used as inputs to control flow). Compute it "
        f"with ops (mt.where, masks), or decide outside the traced function and trace one graph per case.")


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
