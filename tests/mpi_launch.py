"""Run a script under real `mpiexec` from a test: every MPI test in the suite uses this.

    from mpi_launch import requires_mpiexec, run_mpi

    @requires_mpiexec
    def test_something():
        run_mpi(4, [script_path, "arg"], timeout=60)

`run_mpi(n, args)` runs `mpiexec -n n <this python> -m mpi4py <args...>`
(mpi4py's runner turns an unhandled exception on one rank into MPI_Abort, so
the job ends instead of hanging), with one BLAS thread per rank and this
checkout first on PYTHONPATH. It returns the CompletedProcess; a non-zero exit
(or a timeout, after killing the whole job) fails the test with stdout and
stderr shown, unless check=False.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parallel.launch import find_mpiexec

REPO = Path(__file__).resolve().parent.parent
MPIEXEC = find_mpiexec()

requires_mpiexec = pytest.mark.skipif(
    MPIEXEC is None,
    reason=f"!!! NO mpiexec FOUND next to {sys.executable} or on PATH: the MPI tests did NOT run "
           f"(pip install mpich into this environment) !!!")


def run_mpi(n, args, timeout=60, check=True):
    command = [MPIEXEC, "-n", str(n), sys.executable, "-m", "mpi4py", *map(str, args)]
    return run_command(command, timeout, check, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))


def run_command(command, timeout, check=True, env=None, cwd=None):
    """Run `command` with this checkout first on PYTHONPATH. A timeout kills the whole
    process group and fails the test; so does a non-zero exit when `check`."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    # A session of its own, so that a timeout can kill mpiexec and every rank it started.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=cwd, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(map(str, command))} did not finish within {timeout} s\n"
                    f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited with {result.returncode}\n"
                    f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")
    return result
