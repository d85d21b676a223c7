"""What every backend accepts, checked once for both: the dtypes, the reduce ops, the
tags, the peers and axes, a message that fits its buffer, the same call on every rank,
and the deadline and debug settings from the environment.
"""
import os

import numpy as np

from minitensor import dtypes

# float16 and bfloat16 (if ml_dtypes is installed) carry 16-bit activations (minitensor.amp).
# By name: bfloat16's numpy dtype exists only once ml_dtypes is imported (0.6 s of CPU a rank
# that never computes in bfloat16 need not pay), and no bfloat16 array can exist before it.
SUPPORTED_DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16")


def dtype_code(dtype):
    """The dtype's index in SUPPORTED_DTYPES: how a description of an array names it."""
    return SUPPORTED_DTYPES.index(np.dtype(dtype).name)


def named_dtype(name):
    """The numpy dtype of a name in SUPPORTED_DTYPES (bfloat16 imports ml_dtypes)."""
    return np.dtype(dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
REDUCE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
ALGORITHMS = ("builtin", "ring")
# MPI guarantees tags up to 32767; the top one is reserved for ring.py's messages.
TAG_UB = 32767
RING_TAG = TAG_UB
DEFAULT_TIMEOUT_S = 300.0  # generous: a rank may be busy for minutes (a checkpoint save) without being stuck


def check_buffer(arr, what, writeable=False):
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{what} needs a numpy array, got {type(arr).__name__}")
    if arr.dtype.name not in SUPPORTED_DTYPES:
        raise TypeError(f"{what} does not support dtype {arr.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}")
    if writeable and not arr.flags.writeable:
        raise ValueError(f"{what} writes into its buffer, but the array of shape {arr.shape} is read-only")


def check_choice(value, choices, name, what):
    if value not in choices:
        raise ValueError(f"{what}: {name}={value!r} is not one of {choices}")


def check_peer(peer, size, name, what):
    if not isinstance(peer, (int, np.integer)) or not 0 <= peer < size:
        raise ValueError(f"{what}: {name}={peer!r} is out of range for a group of size {size}")


def check_tag(tag, what):
    if not isinstance(tag, (int, np.integer)) or not 0 <= tag < TAG_UB:
        raise ValueError(f"{what}: tag={tag!r} must be an int in [0, {TAG_UB})")


def check_axis(axis, ndim, what):
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis={axis!r} is out of range for an array with {ndim} dimensions")
    return int(axis) % ndim


def check_splits(rows, size, send_splits, recv_splits):
    """all_to_all's (send, recv): rows for each rank of a group of `size`, as lists of ints. Both
    given (`size` non-negative ints each; the sent ones sum to the `rows` of the buffer), or
    neither: `rows` split evenly."""
    if send_splits is None and recv_splits is None:
        if rows % size:
            raise ValueError(f"all_to_all: {rows} rows are not divisible by the group size {size}; "
                             f"pass send_splits and recv_splits")
        return [rows // size] * size, [rows // size] * size
    if send_splits is None or recv_splits is None:
        raise ValueError("all_to_all: pass both send_splits and recv_splits, or neither (even splits)")
    splits = []
    for name, given in (("send_splits", send_splits), ("recv_splits", recv_splits)):
        values = [int(s) for s in given] if all(isinstance(s, (int, np.integer)) for s in given) else None
        if values is None or len(values) != size or min(values) < 0:
            raise ValueError(f"all_to_all: {name}={list(given)!r} must be {size} non-negative ints")
        splits.append(values)
    if sum(splits[0]) != rows:
        raise ValueError(f"all_to_all: send_splits={splits[0]} sum to {sum(splits[0])}, but the buffer has {rows} rows")
    return splits


def received_blocks(sent, rank, recv_splits):
    """The threads backend's all_to_all: from every rank's (buffer, send_splits) in `sent`, the
    blocks for `rank`, in rank order, after checking each has the rows `recv_splits` expects."""
    blocks = []
    for src, ((buf, send), expected) in enumerate(zip(sent, recv_splits)):
        start = sum(send[:rank])
        if send[rank] != expected:
            raise ValueError(f"all_to_all: rank {src} sends {send[rank]} rows to rank {rank}, "
                             f"whose recv_splits expect {expected}")
        blocks.append(buf[start:start + send[rank]])
    return blocks


def check_message(buf, shape, dtype, src, tag):
    """The receive side's check, shared by both backends: the message must fit the buffer exactly."""
    if tuple(shape) != buf.shape or np.dtype(dtype) != buf.dtype:
        raise ValueError(
            f"recv: the message from rank {src} (tag {tag}) has shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
            f"but the receive buffer has shape {buf.shape} and dtype {buf.dtype}")


def check_same_call(calls, size):
    """Every rank of a group must make the same collective call: calls maps rank -> (kind, signature dict).
    Shared by the threads backend (always) and the MPI backend (under PARALLEL_DEBUG=1)."""
    kinds = {r: kind for r, (kind, _) in calls.items()}
    if len(set(kinds.values())) > 1:
        called = ", ".join(f"rank {r} called {k}" for r, k in sorted(kinds.items()))
        raise ValueError(f"collective mismatch in a group of size {size}: {called}")
    signatures = {r: sorted(signature.items()) for r, (_, signature) in calls.items()}
    if any(signature != signatures[0] for signature in signatures.values()):
        described = "; ".join(f"rank {r}: {dict(sig)}" for r, sig in sorted(signatures.items()))
        raise ValueError(f"{kinds[0]} called with different arguments across ranks: {described}")


def check_timeout(seconds, name="timeout"):
    """A communication deadline in seconds: a positive number (`name` is the flag or variable it came from)."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{name}={seconds!r} must be a positive number of seconds")
    return value


def default_timeout():
    """$PARALLEL_TIMEOUT seconds, else DEFAULT_TIMEOUT_S."""
    return check_timeout(os.environ.get("PARALLEL_TIMEOUT", DEFAULT_TIMEOUT_S), "PARALLEL_TIMEOUT")


def timeout_problem(prog, hint="fix it, or unset it for the default"):
    """The one-line error of a bad $PARALLEL_TIMEOUT, as a bad flag's ("PROG: error: ..."), or None.
    Every program that communicates asks first (parallel.train, parallel.bench, --calibrate of
    parallel.plan), instead of failing in its first collective with a traceback."""
    try:
        default_timeout()
    except ValueError as error:
        return f"{prog}: error: {error}; {hint}"
    return None


def default_debug():
    """$PARALLEL_DEBUG set to anything but '' or '0'."""
    return os.environ.get("PARALLEL_DEBUG", "0") not in ("", "0")
