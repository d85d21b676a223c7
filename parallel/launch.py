"""How ranks are launched, and one BLAS thread per rank when they share a machine.

mpiexec starts one process per rank. If each also runs a multi-threaded BLAS,
four ranks on a two-core laptop would run dozens of threads fighting over two
cores, so `limit_blas_threads()` (called by `parallel/__init__.py` before
numpy is imported) sets one BLAS thread per rank unless the user chose a
number. Ranks run as threads of one process (`run_threads`) share its cores the same
way: BLAS runs one thread while they run (minitensor.kernel_threads.blas_thread_per_rank).
`launch_report(group)` says what happened in one line, for callers to print on rank 0.
This module must not import numpy.
"""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Set by mpiexec in every rank: MPICH/Hydra (PMI_*, MPI_LOCALNRANKS) and Open MPI (OMPI_*).
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
_WORLD_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_LAUNCHER_VARS = _LOCAL_SIZE_VARS + _WORLD_SIZE_VARS + ("PMI_RANK", "OMPI_COMM_WORLD_RANK")

_blas_setting = "not limited: a single process"


def launched_by_mpiexec():
    return any(var in os.environ for var in _LAUNCHER_VARS)


def ranks_on_this_machine():
    for var in _LOCAL_SIZE_VARS + _WORLD_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def limit_blas_threads():
    """One BLAS thread per rank when several ranks share this machine (unless the user set it)."""
    global _blas_setting
    ranks = ranks_on_this_machine()
    if ranks <= 1:
        return
    user_set = [var for var in BLAS_THREAD_VARS if var in os.environ]
    for var in BLAS_THREAD_VARS:
        os.environ.setdefault(var, "1")
    if user_set:
        _blas_setting = "as set by the user: " + ", ".join(f"{v}={os.environ[v]}" for v in user_set)
    elif "numpy" in sys.modules:
        _blas_setting = "NOT limited: numpy was imported before parallel, too late to set BLAS threads"
    else:
        _blas_setting = f"1 BLAS thread per rank ({ranks} ranks share this machine)"


def launch_report(group):
    """One line for rank 0 to print: how many ranks, which backend, BLAS threads."""
    blas = _blas_setting
    if group.backend == "threads" and group.size > 1:  # run_threads: minitensor.kernel_threads.blas_thread_per_rank
        blas = f"1 while the {group.size} ranks run (they share this process's cores)"
    return f"parallel: {group.size} rank(s) on the {group.backend} backend; BLAS threads: {blas}"


def find_mpiexec():
    """The mpiexec next to this Python (a venv with mpich from PyPI), else the one on PATH, else None."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def rank_arguments(description, default_threads=2):
    """An argument parser with `--threads N`, for scripts that run on several ranks."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=default_threads,
                        help=f"ranks to run as threads of this process when not under mpiexec "
                             f"(default {default_threads})")
    return parser


def run_on_mpi_ranks(n, module, *args, timeout=None):
    """`mpiexec -n N python -m mpi4py -m MODULE ARGS...`, one BLAS thread per rank and this
    checkout importable; returns the job's stdout. Benchmarks and the planner's calibration
    launch their workers this way. A missing mpiexec or a failed job is a RuntimeError that
    names the command and shows its error output."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError(f"no mpiexec next to {sys.executable} or on PATH (pip install mpich)")
    command = [mpiexec, "-n", str(n), sys.executable, "-m", "mpi4py", "-m", module, *map(str, args)]
    checkout = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")])))
    env.update({var: "1" for var in BLAS_THREAD_VARS})
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stderr}")
    return done.stdout


if __name__ == "__main__":  # python -m parallel.launch --elastic ...: the agent (parallel/elastic.py) in this
    if sys.argv[1:2] != ["--elastic"]:  # process's place, so that this module imports nothing of the project
        sys.exit("usage: python -m parallel.launch --elastic --ranks N [--min-ranks K] [--max-restarts R] -- FLAGS")
    os.execv(sys.executable, [sys.executable, "-m", "parallel.elastic", *sys.argv[2:]])
