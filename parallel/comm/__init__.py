"""Communication: the Group interface, its threads and MPI backends, and world()."""
from .group import Group
from .request import CommTimeout, Request
from .threads import CommAborted, DeadlockError, run_threads
from .world import run_on_ranks, world

__all__ = ["CommAborted", "CommTimeout", "DeadlockError", "Group", "Request", "run_on_ranks", "run_threads", "world"]
