"""`world()`: the group of every rank in this run, whichever way it was launched; and
`run_on_ranks`, which runs a function on every rank of either launch."""
import sys

from .. import launch
from .threads import current_group, run_threads, single_rank_group

_mpi_world = None
_single_world = None


def world(timeout=None, debug=None):
    """The calling thread's world inside run_threads; COMM_WORLD under mpiexec; else a size-1 group.

    timeout, debug: if given, set the world's deadline in seconds and its debug checks
    (Group.configure), which the groups split from it afterwards inherit.
    mpi4py is imported only under mpiexec (or if the program already imported it).
    """
    return _find_world().configure(timeout, debug)


def _find_world():
    global _mpi_world, _single_world
    group = current_group()
    if group is not None:
        return group
    if launch.launched_by_mpiexec() or "mpi4py.MPI" in sys.modules:
        if _mpi_world is None:
            from .mpi import comm_world
            _mpi_world = comm_world()
        return _mpi_world
    if _single_world is None:
        _single_world = single_rank_group()
    return _single_world


def run_on_ranks(threads, fn, *args):
    """Run fn(*args) on every rank: once per MPI process under mpiexec, else on
    `threads` threads of this process (parallel.run_threads). Returns this process's results."""
    if launch.launched_by_mpiexec():
        return [fn(*args)]
    return run_threads(threads, fn, *args)
