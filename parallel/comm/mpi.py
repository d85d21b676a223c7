"""The MPI backend: a Group over an mpi4py communicator, on its buffer methods only.

Collectives map one to one onto MPI (`Allreduce`, `Iallreduce`, `Allgather`,
`Reduce_scatter_block`, `Bcast`, `Barrier`, `Split`); numpy arrays are passed
as buffers, so nothing is pickled.

Point-to-point messages carry a small header: before each payload the sender
sends, with the same tag, an int64 array [dtype code, ndim, *shape]. MPI
delivers messages of one (source, tag) in order, so each header meets its
receive's header buffer; the receiver checks it against its buffer *before*
waiting for the payload and raises the same ValueError as the threads
backend, naming both shapes and dtypes. The header is not counted in stats.

Mismatched collectives across ranks (different shapes or roots) are not
checked here: that would cost an extra collective on every call. Run the
code under the threads backend to get those checks.
"""
import numpy as np
from mpi4py import MPI

from .group import Group, Request, SUPPORTED_DTYPES, check_message

_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_MAX_NDIM = 32  # numpy's limit
_HEADER_LEN = 2 + _MAX_NDIM


def _encode_header(buf):
    header = np.zeros(_HEADER_LEN, np.int64)
    header[0], header[1] = SUPPORTED_DTYPES.index(buf.dtype), buf.ndim
    header[2:2 + buf.ndim] = buf.shape
    return header


def _decode_header(header):
    ndim = int(header[1])
    return tuple(int(n) for n in header[2:2 + ndim]), SUPPORTED_DTYPES[int(header[0])]


class MPIGroup(Group):
    backend = "mpi"

    def __init__(self, comm):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm

    def _all_reduce(self, buf, op):
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=_OPS[op])

    def _iall_reduce(self, buf, op):
        request = self.comm.Iallreduce(MPI.IN_PLACE, buf, op=_OPS[op])
        return Request(request.Wait)

    def _all_gather(self, buf, out):
        self.comm.Allgather(buf, out)

    def _reduce_scatter(self, blocks, out, op):
        self.comm.Reduce_scatter_block(blocks, out, op=_OPS[op])

    def _broadcast(self, buf, root):
        self.comm.Bcast(buf, root=root)

    def _barrier(self):
        self.comm.Barrier()

    def _split(self, color, key):
        return MPIGroup(self.comm.Split(color, key))

    def _isend(self, buf, dst, tag):
        header = _encode_header(buf)
        requests = [self.comm.Isend(header, dst, tag), self.comm.Isend(buf, dst, tag)]
        return Request(lambda: MPI.Request.Waitall(requests))

    def _irecv(self, buf, src, tag):
        header = np.empty(_HEADER_LEN, np.int64)
        header_request = self.comm.Irecv(header, src, tag)
        payload_request = self.comm.Irecv(buf, src, tag)

        def complete():
            header_request.Wait()
            check_message(buf, *_decode_header(header), src, tag)
            payload_request.Wait()
        return Request(complete)


def comm_world():
    return MPIGroup(MPI.COMM_WORLD)
