"""What nn.functional's ops and the losses check of their inputs: the input in the
parameters' dtype, class indices that are integers and in range."""
import numpy as np

from minitensor.operands import dtype_mismatch
from minitensor.tensor import Tensor


def input_in_dtype_of(op, x, *params):
    """`x` as a Tensor (a numpy array is wrapped, not copied) in the parameters' dtype.

    The parameters decide; an input in another dtype is an error saying how to cast it,
    never a silent conversion.
    """
    x = x if isinstance(x, Tensor) else Tensor(x)
    want = params[0].dtype
    if len({p.dtype for p in params}) > 1:
        raise dtype_mismatch(op, *params)
    if x.dtype != want:
        raise TypeError(f"{op}: the input is {x.dtype} but the weights are {want}; cast the input: "
                        f"mt.tensor(x, dtype=mt.{want}) for a numpy array, x.to(mt.{want}) for a tensor")
    return x


def index_array(idx):
    """Class indices (a tensor or array) as an integer numpy array."""
    idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
    return idx


def classes_last(scores, targets):
    """`scores` with its classes in the last dim. They are there already (this engine's
    layout, the GPT's (B, T, V)), unless the integer `targets` say otherwise: targets of
    shape (N, d1, ...) for scores (N, C, d1, ...) are PyTorch's layout, classes in dim 1,
    moved last (differentiably). Where both readings fit, the engine's (last) wins."""
    shape = np.shape(targets.data if isinstance(targets, Tensor) else targets)
    if scores.ndim < 3 or shape == scores.shape[:-1] or shape != scores.shape[:1] + scores.shape[2:]:
        return scores
    return scores.permute(0, *range(2, scores.ndim), 1)


def check_class_targets(op, scores, targets, ignore_index):
    """`targets` (...) of integer classes in [0, C) (or ignore_index) for `scores` (..., C)."""
    targets = index_array(targets)
    if scores.ndim == 0 or scores.shape[:-1] != targets.shape:
        raise ValueError(f"{op}: input {scores.shape} needs targets of shape {scores.shape[:-1]} "
                         f"(classes are the last dim), got {targets.shape}")
    classes = scores.shape[-1]
    outside = (targets != ignore_index) & ((targets < 0) | (targets >= classes))  # one vectorised test
    if outside.any():
        raise ValueError(f"{op}: target {targets[outside][0]} is not a class in [0, {classes}) "
                         f"and not ignore_index ({ignore_index})")
    return targets
