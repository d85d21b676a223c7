"""parallel: data, tensor and pipeline parallelism over MPI ranks or threads."""
from .launch import limit_blas_threads

limit_blas_threads()  # must run before numpy is imported below

from .comm import Group, run_threads, world  # noqa: E402
from .mesh import Mesh  # noqa: E402

__all__ = ["Group", "run_threads", "world", "Mesh"]
