"""Entry point: `python -m parallel.train` (under MPI: `mpiexec -n N python -m parallel.train`).

Any error ends the whole job with one line on stderr and a non-zero exit (errors.py).

One BLAS thread per rank. Under mpiexec `parallel.launch` sets it before numpy loads. In
one process (and with --threads N, whose ranks share the process) numpy is already
loaded by `import parallel` when this module runs, so if the user chose no BLAS thread
count the job restarts itself once with one: on this model's small matrices extra BLAS
threads gain little, and on a busy or shared machine their spin-waiting made steps
ten times slower.

The job keeps freed memory in the process for the next step (minitensor.allocator):
without it, glibc hands each step's activations back to the OS and the next step faults
them in again (the recipe's 1500 steps: 50 s → 38 s on this 2-core machine).
"""
import os
import sys

from minitensor.allocator import keep_freed_memory

from ..launch import BLAS_THREAD_VARS, launched_by_mpiexec
from .cli import main
from .errors import run_job
from .report import RESTARTED

if not launched_by_mpiexec() and not any(var in os.environ for var in BLAS_THREAD_VARS):
    env = dict(os.environ, **{var: "1" for var in BLAS_THREAD_VARS}, **{RESTARTED: "1"})
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
keep_freed_memory()
run_job(main)
