"""PyTorch's type promotion: the dtype an op computes in when its operands' dtypes differ.

Dtypes fall in three categories, bool < integer < floating. Operands come in three kinds,
by how much say they have (`torch.result_type`):

    dimensioned   a tensor (or numpy array) with at least one dim
    zero-dim      a 0-d tensor
    wrapped       a Python number (or numpy scalar): bool → bool, int → int64,
                  float → the default float dtype, float32

Within each kind the dtypes promote as usual (int32 with int64 → int64, an integer with a
float → the float). Across kinds a lower kind decides only when it brings a higher
category: float32 tensor + 2.5 → float32, int32 tensor + 2.5 → float32, int32 tensor +
7 → int32, int64 tensor + 0-d float64 tensor → float64, float32 tensor + 0-d float64
tensor → float32.

One rule is this project's, not PyTorch's: two float tensors of different dtypes that
would both count (float32 with float64) are an error naming both, not a silent upcast
of a float32 model to float64 (DESIGN.md); convert one explicitly.
"""
import numpy as np

from minitensor import dtypes
from minitensor.errors import DTypeError

DEFAULT_FLOAT = np.dtype(np.float32)
DEFAULT_INT = np.dtype(np.int64)


def category(dtype):
    """0 for bool, 1 for integers, 2 for floats."""
    return 2 if dtypes.is_floating(dtype) else 0 if dtype == np.bool_ else 1


def promote_types(a, b):
    """The dtype holding both `a` and `b`: the higher category's dtype, or numpy's promotion
    within one category (a float16 with a bfloat16 → float32, as in PyTorch)."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:  # two different floats: a 16-bit one counts as float32 (numpy knows no bfloat16)
        a, b = (np.dtype(np.float32) if dtypes.is_sixteen_bit(t) else t for t in (a, b))
    return np.promote_types(a, b)


def wrapped_dtype(value):
    """The dtype a Python number (or numpy scalar, or 0-d array) stands for."""
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(np.bool_)
    if isinstance(value, (int, np.integer)):
        return DEFAULT_INT
    return DEFAULT_FLOAT


def _combine(higher, lower):
    """torch's combine_categories: a lower kind counts only when it raises the category."""
    if higher is None:
        return lower
    if lower is None or category(higher) == 2:
        return higher
    if higher == np.bool_ or category(lower) == 2:
        return promote_types(higher, lower)
    return higher


def _promote_all(dtype_list):
    result = None
    for dtype in dtype_list:
        result = dtype if result is None else promote_types(result, dtype)
    return result


def result_type(op, *operands):
    """The dtype `op` computes in. Each operand is a numpy array (a tensor's data) or a
    Python number; arrays of ≥ 1 dim are dimensioned, 0-d arrays zero-dim."""
    arrays = [x for x in operands if isinstance(x, np.ndarray)]
    dims = [x.dtype for x in arrays if x.ndim]
    zeros = [x.dtype for x in arrays if not x.ndim]
    wrapped = [wrapped_dtype(x) for x in operands if not isinstance(x, np.ndarray)]
    for kind in (dims, zeros if not dims else ()):
        floats = {d for d in kind if category(d) == 2}
        if len(floats) > 1:
            raise DTypeError(f"{op}: dtypes {sorted(str(d) for d in floats)} differ; convert one explicitly: "
                            f"t.to(mt.float32) (or .float(), .double()) for a tensor, "
                            f"mt.tensor(array, dtype=mt.float32) for a numpy array")
    return _combine(_promote_all(dims), _combine(_promote_all(zeros), _promote_all(wrapped)))
