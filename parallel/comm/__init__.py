"""Communication: the Group interface, its threads and MPI backends, and world()."""
from .group import Group, Request
from .threads import CommAborted, DeadlockError, run_threads
from .world import world

__all__ = ["Group", "Request", "run_threads", "world", "CommAborted", "DeadlockError"]
