"""The `Group` interface: one communicator (`rank`, `size`) and its collectives.

Every buffer is a numpy array of float32, float64, int32 or int64. Both
backends (threads.py, mpi.py) inherit the public methods below, so argument
checks, contiguous copies and the call accounting are written once; a backend
only supplies the underscored primitives, which always receive C-contiguous,
already validated buffers.

Accounting: `stats()` maps each kind of call to its calls, elements and bytes
*for this rank*, using the standard per-rank cost model of bandwidth-optimal
algorithms on n = `size` ranks (the numbers nccl-tests and the ZeRO paper use):

    all_reduce      elements of the buffer     bytes = 2(n-1)/n * buffer bytes
    all_gather      elements of the gathered   bytes =  (n-1)/n * gathered bytes
    reduce_scatter  elements of the unscattered bytes = (n-1)/n * unscattered bytes
    broadcast       elements of the buffer     bytes = buffer bytes (0 if n == 1)
    all_to_all      elements of the buffer     bytes = buffer bytes - the rows it sends itself
    send, recv      elements of the message    bytes = message bytes
    barrier, split  0                          bytes = 0

Fractions round down to whole bytes. `isend`/`irecv` count as "send"/"recv",
an `async_op` collective as its blocking kind. `algorithm="ring"` is counted as
one all_reduce with the formula above (which is exactly what the ring moves);
its internal point-to-point messages are not counted again.
"""

import numpy as np

from .checks import (
    ALGORITHMS,
    REDUCE_UFUNCS,
    check_axis,
    check_buffer,
    check_choice,
    check_peer,
    check_splits,
    check_tag,
    check_timeout,
    default_debug,
    default_timeout,
)
from .request import Pending, Request
from .ring import ring_all_reduce


def copy_back(arr, work):
    """Finish an in-place operation that ran on `work`, a contiguous copy of `arr` (or `arr` itself)."""
    if work is not arr:
        arr[...] = work
    return arr


class Group:
    """One communicator: `rank` in [0, `size`) and numpy-buffer collectives (see the module docstring).

    `timeout`: seconds any operation may take before every waiting rank raises CommTimeout
    (default $PARALLEL_TIMEOUT or 300); `debug`: under MPI, check before each collective
    that every rank makes the same call (default $PARALLEL_DEBUG). Groups split from this
    one inherit both.

    A backend subclass supplies non-blocking primitives for C-contiguous validated buffers,
    each returning a request.Pending: `_iall_reduce(buf, op)`, `_iall_gather(buf, out)` with
    out of shape (size, *buf.shape), `_ireduce_scatter(blocks, out, op)` with blocks of shape
    (size, *out.shape), `_ibroadcast(buf, root)`, `_iall_to_all(buf, send, out, recv)` (rows per rank as lists), `_ibarrier()`, `_isplit(color, key)` (its
    finish() is the new Group), `_isend(buf, dst, tag)`, `_irecv(buf, src, tag)` (whose poll
    raises check_message's ValueError on a mismatched message); and `world_ranks()`,
    `abort(code)`, `poll_backoff` (see request.py).
    """

    backend = "abstract"

    def __init__(self, rank, size):
        self.rank = rank
        self.size = size
        self._timeout = None  # read from $PARALLEL_TIMEOUT when first needed, unless configure() set it
        self.debug = default_debug()
        self._stats = {}

    @property
    def timeout(self):
        """Seconds a rank waits for another before CommTimeout: configure(timeout=...) (the
        programs' --timeout) wins; else $PARALLEL_TIMEOUT, else 300. Read only when first
        needed, so a bad $PARALLEL_TIMEOUT does not matter when --timeout is given."""
        if self._timeout is None:
            self._timeout = default_timeout()
        return self._timeout

    @timeout.setter
    def timeout(self, seconds):
        self._timeout = seconds

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"

    def configure(self, timeout=None, debug=None):
        """Set the deadline (seconds) and/or the debug checks of this group and the groups split from it later."""
        if timeout is not None:
            self.timeout = check_timeout(timeout)
        if debug is not None:
            self.debug = bool(debug)
        return self

    def describe(self):
        """Which group this is, for messages: its size and its members' ranks in the world."""
        return f"the group of {self.size} rank(s) with world ranks {list(self.world_ranks())}"

    def abort(self, code=1):
        """End the whole job with exit status `code`, every rank of it (MPI_Abort under MPI)."""
        raise SystemExit(code)

    # --- accounting ---------------------------------------------------------------

    def stats(self):
        """kind -> {"calls", "elements", "bytes"} for this rank (a copy)."""
        return {kind: dict(counts) for kind, counts in self._stats.items()}

    def reset_stats(self):
        self._stats = {}

    def _count(self, kind, elements, nbytes):
        counts = self._stats.setdefault(kind, {"calls": 0, "elements": 0, "bytes": 0})
        counts["calls"] += 1
        counts["elements"] += int(elements)
        counts["bytes"] += int(nbytes)

    # --- collectives --------------------------------------------------------------

    def all_reduce(self, arr, op="sum", algorithm="builtin", async_op=False):
        """Reduce `arr` elementwise over all ranks, in place; returns `arr` (or a Request if async_op)."""
        check_buffer(arr, "all_reduce", writeable=True)
        check_choice(op, tuple(REDUCE_UFUNCS), "op", "all_reduce")
        check_choice(algorithm, ALGORITHMS, "algorithm", "all_reduce")
        if async_op and algorithm != "builtin":
            raise ValueError(f"all_reduce: async_op=True needs algorithm='builtin', got {algorithm!r}")
        n = self.size
        self._count("all_reduce", arr.size, 2 * (n - 1) * arr.nbytes // n)
        if n == 1:  # the sum (max, ...) of one rank's buffer is the buffer: nothing to send or wait for
            return Request(self, "all_reduce", Pending(lambda pause: True), lambda _: arr) if async_op else arr
        work = np.ascontiguousarray(arr)
        if algorithm == "ring":
            ring_all_reduce(self, work.reshape(-1), op)
            return copy_back(arr, work)
        request = Request(self, f"all_reduce(op={op!r})", self._iall_reduce(work, op), lambda _: copy_back(arr, work))
        return request if async_op else request.wait()

    def all_gather(self, arr, axis=0, async_op=False):
        """A new array: every rank's `arr` concatenated along `axis`, in rank order
        (or a Request whose wait() returns it, if async_op)."""
        check_buffer(arr, "all_gather")
        axis = check_axis(axis, arr.ndim, "all_gather")
        n = self.size
        self._count("all_gather", n * arr.size, (n - 1) * arr.nbytes)
        stacked = np.empty((n,) + arr.shape, arr.dtype)
        # (n, ..., s, ...) -> (..., n, s, ...) -> (..., n*s, ...): rank r's block lands at r*s.
        shape = arr.shape[:axis] + (n * arr.shape[axis],) + arr.shape[axis + 1:]
        joined = lambda _: np.moveaxis(stacked, 0, axis).reshape(shape) if axis else stacked.reshape(shape)
        request = Request(self, "all_gather", self._iall_gather(np.ascontiguousarray(arr), stacked), joined)
        return request if async_op else request.wait()

    def reduce_scatter(self, arr, axis=0, op="sum", async_op=False):
        """A new array: this rank's equal chunk along `axis` of the elementwise reduction of `arr`
        (or a Request whose wait() returns it, if async_op)."""
        check_buffer(arr, "reduce_scatter")
        axis = check_axis(axis, arr.ndim, "reduce_scatter")
        check_choice(op, tuple(REDUCE_UFUNCS), "op", "reduce_scatter")
        n = self.size
        if arr.shape[axis] % n:
            raise ValueError(f"reduce_scatter: shape {arr.shape} has {arr.shape[axis]} entries along axis {axis}, "
                             f"not divisible by the group size {n}")
        self._count("reduce_scatter", arr.size, (n - 1) * arr.nbytes // n)
        # Bring `axis` to the front so that rank r's chunk is the contiguous block r.
        front = np.moveaxis(arr, axis, 0)
        blocks = np.ascontiguousarray(front).reshape((n, front.shape[0] // n) + front.shape[1:])
        chunk = np.empty(blocks.shape[1:], arr.dtype)
        request = Request(self, f"reduce_scatter(op={op!r})", self._ireduce_scatter(blocks, chunk, op),
                          lambda _: np.ascontiguousarray(np.moveaxis(chunk, 0, axis)))
        return request if async_op else request.wait()

    def broadcast(self, arr, root=0):
        """Copy root's `arr` into every rank's `arr`, in place; returns `arr`."""
        check_buffer(arr, "broadcast", writeable=True)
        check_peer(root, self.size, "root", "broadcast")
        self._count("broadcast", arr.size, arr.nbytes if self.size > 1 else 0)
        work = np.ascontiguousarray(arr)
        Request(self, f"broadcast(root={root})", self._ibroadcast(work, int(root))).wait()
        return copy_back(arr, work)

    def all_to_all(self, arr, send_splits=None, recv_splits=None):
        """A new array: this rank sends its consecutive blocks of `send_splits[r]` rows (axis 0) of
        `arr` to rank r, and returns the blocks it receives, `recv_splits[s]` rows from rank s,
        concatenated in rank order (MPI's Alltoallv). Without splits, equal blocks (Alltoall).
        Each rank must expect what the others send it (the threads backend checks it)."""
        check_buffer(arr, "all_to_all")
        if arr.ndim == 0:
            raise ValueError("all_to_all needs an array with at least one axis (the rows it splits)")
        send, recv = check_splits(arr.shape[0], self.size, send_splits, recv_splits)
        row_bytes = arr.itemsize * int(np.prod(arr.shape[1:]))
        self._count("all_to_all", arr.size, (arr.shape[0] - send[self.rank]) * row_bytes)
        out = np.empty((sum(recv),) + arr.shape[1:], arr.dtype)
        Request(self, "all_to_all", self._iall_to_all(np.ascontiguousarray(arr), send, out, recv)).wait()
        return out

    def barrier(self):
        self._count("barrier", 0, 0)
        Request(self, "barrier", self._ibarrier()).wait()

    def split(self, color, key=None):
        """A new Group of the ranks that pass the same `color`, ordered by `key` (default: this rank)."""
        key = self.rank if key is None else key
        for name, value in (("color", color), ("key", key)):
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"split: {name}={value!r} must be a non-negative int")
        self._count("split", 0, 0)
        child = Request(self, "split", self._isplit(int(color), int(key))).wait()
        return child.configure(self.timeout, self.debug)

    # --- point to point -------------------------------------------------------------

    def isend(self, arr, dst, tag=0):
        """Start sending `arr` to rank `dst`; the Request's wait() returns once the message is matched."""
        check_buffer(arr, "send")
        check_peer(dst, self.size, "dst", "send")
        check_tag(tag, "send")
        self._count("send", arr.size, arr.nbytes)
        work = np.ascontiguousarray(arr)
        return Request(self, f"send(dst={dst}, tag={tag})", self._isend(work, int(dst), int(tag)), lambda _: arr)

    def irecv(self, arr, src, tag=0):
        """Start receiving the next message from `src` with `tag` into `arr`; wait() returns `arr`."""
        check_buffer(arr, "recv", writeable=True)
        check_peer(src, self.size, "src", "recv")
        check_tag(tag, "recv")
        self._count("recv", arr.size, arr.nbytes)
        work = np.ascontiguousarray(arr)
        pending = self._irecv(work, int(src), int(tag))
        return Request(self, f"recv(src={src}, tag={tag})", pending, lambda _: copy_back(arr, work))

    def send(self, arr, dst, tag=0):
        self.isend(arr, dst, tag).wait()

    def recv(self, arr, src, tag=0):
        return self.irecv(arr, src, tag).wait()
