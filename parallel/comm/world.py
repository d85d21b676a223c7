"""`world()`: the group of every rank in this run, whichever way it was launched."""
import sys

from .. import launch
from . import threads

_mpi_world = None
_single_world = None


def world():
    """The calling thread's world inside run_threads; COMM_WORLD under mpiexec; else a size-1 group.

    mpi4py is imported only under mpiexec (or if the program already imported it).
    """
    global _mpi_world, _single_world
    group = threads.current_group()
    if group is not None:
        return group
    if launch.launched_by_mpiexec() or "mpi4py.MPI" in sys.modules:
        if _mpi_world is None:
            from .mpi import comm_world
            _mpi_world = comm_world()
        return _mpi_world
    if _single_world is None:
        _single_world = threads.single_rank_group()
    return _single_world
