"""The MPI backend: a Group over an mpi4py communicator, on its buffer methods only.

Every operation is MPI's non-blocking one (`Iallreduce`, `Iallgather`,
`Ireduce_scatter_block`, `Ibcast`, `Ialltoallv`, `Ibarrier`, `Isend`, `Irecv`), polled with
`Test` by request.py's deadline loop, so a stopped rank makes the others raise
CommTimeout instead of hanging. numpy arrays are passed as buffers: nothing is
pickled. `Split` has no non-blocking form; an `Ibarrier` comes first, so a
split starts only when every rank has arrived.

What a timed-out rank can say: a receive knows which rank has not sent. A
collective does not: MPI gives a waiting rank no way to ask who has joined, so
the message says so rather than guess.

Point-to-point messages carry a small header: before each payload the sender
sends, with the same tag, an int64 array [dtype code, ndim, *shape]. MPI
delivers messages of one (source, tag) in order, so each header meets its
receive's header buffer; the receiver checks it against its buffer *before*
the payload is taken and raises the same ValueError as the threads backend,
naming both shapes and dtypes. The header is not counted in stats.

Collectives across ranks that do not match (one rank all-reduces, another
broadcasts; different shapes) are checked only with `debug` on
(PARALLEL_DEBUG=1): each collective then first all-gathers a fixed-size int64
description of the call (debug.py), one extra small collective per call.

bfloat16 (minitensor.dtypes) has no MPI datatype and mpi4py rejects its buffers: such
an array travels as its 16-bit patterns (UINT16_T), and its sums and maxima are MPI
user-defined operations that add the patterns as bfloat16 (`_message`, `_op`).
"""
import functools
import os
import time

import numpy as np
from mpi4py import MPI

from minitensor import dtypes

from .checks import check_message
from .debug import check_calls_agree
from .gather import describe, read_description
from .group import Group
from .request import Pending

_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


_BF16_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


@functools.cache
def _bfloat16_op(op):
    """An MPI operation combining bfloat16 arrays sent as UINT16_T: inout = ufunc(inout, in);
    made when first needed (by then a bfloat16 array exists, so ml_dtypes is loaded)."""
    ufunc, bfloat16 = _BF16_UFUNCS[op], dtypes.bfloat16

    def combine(inbuf, inoutbuf, datatype):
        inout = np.frombuffer(inoutbuf, dtype=bfloat16)
        ufunc(inout, np.frombuffer(inbuf, dtype=bfloat16), out=inout)
    return MPI.Op.Create(combine, commute=True)


def _is_bfloat16(buf):
    return buf.dtype.name == "bfloat16"


def _message(buf):
    """What mpi4py is given for `buf`: the array, or a bfloat16 array's bits as UINT16_T."""
    return [buf.view(np.uint16), MPI.UINT16_T] if _is_bfloat16(buf) else buf


def _vector(buf, splits, row):
    """mpi4py's buffer with counts and displacements (in elements) for Alltoallv: `splits` rows of `row` elements."""
    counts = [s * row for s in splits]
    displacements = [sum(counts[:r]) for r in range(len(counts))]
    message = _message(buf)
    if isinstance(message, list):
        return [message[0], (counts, displacements), message[1]]
    return [buf, (counts, displacements)]


def _op(op, buf):
    return _bfloat16_op(op) if _is_bfloat16(buf) else _OPS[op]
_MAX_NDIM = 32  # numpy's limit
_HEADER_LEN = 2 + _MAX_NDIM
_COLLECTIVE_UNKNOWN = ("MPI does not tell a waiting rank which ranks have not joined a collective: "
                       "one may be stopped, stuck in compute, or waiting in a different collective")


def _encode_header(buf):
    """The message's [dtype code, ndim, *shape] (gather.describe), zero-padded to a fixed length."""
    header = np.zeros(_HEADER_LEN, np.int64)
    description = describe(buf.dtype, buf.shape)
    header[:len(description)] = description
    return header


def _decode_header(header):
    dtype, shape, _ = read_description(header)
    return shape, dtype


def _tested(requests, pause):
    """Poll MPI requests: True once all completed, else sleep `pause` seconds and say False. A pause
    of 0 yields the core (as MPICH's own busy waits do): a rank sharing it may be the one we wait for."""
    if MPI.Request.Testall(requests):
        return True
    if pause:
        time.sleep(pause)
    else:
        os.sched_yield()
    return False


class MPIGroup(Group):
    backend = "mpi"
    # Test (yielding the core) for 10 ms, then sleep 50 µs, doubling up to 1 ms (request.py).
    poll_backoff = (1e-2, 5e-5, 1e-3)

    def __init__(self, comm):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm

    def world_ranks(self):
        return self.comm.Get_group().Translate_ranks(list(range(self.size)), MPI.COMM_WORLD.Get_group())

    def abort(self, code=1):
        self.comm.Abort(code)

    def _collective(self, kind, signature, start, finish=None):
        """Start MPI's non-blocking `start()`, after checking the call against every rank's under debug."""
        if self.debug:
            check_calls_agree(self, kind, signature, self._gather_unchecked)
        requests = [start()]
        return Pending(lambda pause: _tested(requests, pause), finish, lambda: _COLLECTIVE_UNKNOWN)

    def _gather_unchecked(self, buf, out):
        requests = [self.comm.Iallgather(buf, out)]
        return Pending(lambda pause: _tested(requests, pause), None, lambda: _COLLECTIVE_UNKNOWN)

    def _iall_reduce(self, buf, op):
        signature = {"shape": buf.shape, "dtype": buf.dtype, "op": op}
        return self._collective("all_reduce", signature, lambda: self.comm.Iallreduce(MPI.IN_PLACE, _message(buf),
                                                                                     _op(op, buf)))

    def _iall_gather(self, buf, out):
        signature = {"shape": buf.shape, "dtype": buf.dtype}
        return self._collective("all_gather", signature, lambda: self.comm.Iallgather(_message(buf), _message(out)))

    def _ireduce_scatter(self, blocks, out, op):
        signature = {"shape": blocks.shape, "dtype": blocks.dtype, "op": op}
        start = lambda: self.comm.Ireduce_scatter_block(_message(blocks), _message(out), _op(op, blocks))
        return self._collective("reduce_scatter", signature, start)

    def _ibroadcast(self, buf, root):
        signature = {"shape": buf.shape, "dtype": buf.dtype, "root": root}
        return self._collective("broadcast", signature, lambda: self.comm.Ibcast(_message(buf), root))

    def _iall_to_all(self, buf, send, out, recv):
        row = int(np.prod(buf.shape[1:]))
        signature = {"shape": buf.shape[1:], "dtype": buf.dtype}  # the rows' shape: their counts differ
        start = lambda: self.comm.Ialltoallv(_vector(buf, send, row), _vector(out, recv, row))
        return self._collective("all_to_all", signature, start)

    def _ibarrier(self):
        return self._collective("barrier", {}, self.comm.Ibarrier)

    def _isplit(self, color, key):
        return self._collective("split", {}, self.comm.Ibarrier, lambda: MPIGroup(self.comm.Split(color, key)))

    def _isend(self, buf, dst, tag):
        requests = [self.comm.Isend(_encode_header(buf), dst, tag), self.comm.Isend(_message(buf), dst, tag)]
        return Pending(lambda pause: _tested(requests, pause), None,
                       lambda: f"rank {dst} has not received the message (tag {tag})")

    def _irecv(self, buf, src, tag):
        header = np.empty(_HEADER_LEN, np.int64)
        header_request = self.comm.Irecv(header, src, tag)
        payload_request = self.comm.Irecv(_message(buf), src, tag)
        checked = []

        def poll(pause):
            if not checked:  # the header first: a wrong buffer is a clear error, not "Message truncated"
                if not _tested([header_request], pause):
                    return False
                check_message(buf, *_decode_header(header), src, tag)
                checked.append(True)
            return _tested([payload_request], pause)

        def missing():
            if checked:
                return f"the message from rank {src} (tag {tag}) has begun to arrive but is not complete"
            return f"rank {src} has not sent the message (tag {tag})"
        return Pending(poll, None, missing)


def comm_world():
    return MPIGroup(MPI.COMM_WORLD)
