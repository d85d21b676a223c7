"""Debug checks for MPI (PARALLEL_DEBUG=1): before each collective, the ranks compare their calls.

The threads backend compares every rank's call by itself (threads.py). MPI does
not: if one rank all-reduces 4 floats while another broadcasts 8, the job gets
"Message truncated", wrong numbers or a hang. With a group's `debug` on, each
collective first all-gathers a fixed-size int64 description of this rank's
call,

    [kind, dtype, op, root, ndim, *shape padded to 32 dimensions]   (-1: not used)

and if any rank's row differs, every rank raises the same ValueError as the
threads backend (group.check_same_call), naming each rank's call.

The cost: one extra all-gather of 37 int64 (296 bytes per rank) before every
collective, on every rank. It is latency, not bandwidth: at small sizes it
doubles the time of a collective; see README.md for the measurement.
"""
import numpy as np

from .checks import REDUCE_UFUNCS, SUPPORTED_DTYPES, check_same_call, dtype_code
from .request import Request

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "split", "all_to_all")
OPS = tuple(REDUCE_UFUNCS)
DTYPES = SUPPORTED_DTYPES
MAX_NDIM = 32  # numpy's limit
LENGTH = 5 + MAX_NDIM


def encode_call(kind, signature):
    """The int64 row that describes one collective call; signature: shape, dtype, op, root as used
    (the dtype as a numpy dtype: naming it costs microseconds, and only a mismatch needs the name)."""
    row = np.full(LENGTH, -1, np.int64)
    row[0] = KINDS.index(kind)
    if "dtype" in signature:
        row[1] = dtype_code(signature["dtype"])
    if "op" in signature:
        row[2] = OPS.index(signature["op"])
    if "root" in signature:
        row[3] = signature["root"]
    if "shape" in signature:
        shape = signature["shape"]
        row[4] = len(shape)
        row[5:5 + len(shape)] = shape
    return row


def decode_call(row):
    """(kind, signature): the inverse of encode_call."""
    signature = {}
    if row[4] >= 0:
        signature["shape"] = tuple(int(n) for n in row[5:5 + row[4]])
    if row[1] >= 0:
        signature["dtype"] = DTYPES[row[1]]
    if row[2] >= 0:
        signature["op"] = OPS[row[2]]
    if row[3] >= 0:
        signature["root"] = int(row[3])
    return KINDS[row[0]], signature


def check_calls_agree(group, kind, signature, gather):
    """Raise check_same_call's ValueError on every rank unless all ranks of `group` make this call.
    gather(row, rows) starts an all-gather that is not itself checked, returning a request.Pending."""
    mine = encode_call(kind, signature)
    rows = np.empty((group.size, LENGTH), np.int64)
    Request(group, f"{kind} (its PARALLEL_DEBUG check)", gather(mine, rows)).wait()
    if (rows != mine).any():
        check_same_call({r: decode_call(row) for r, row in enumerate(rows)}, group.size)
