"""parallel/launch.py: one BLAS thread per rank when mpiexec starts several ranks on this machine."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PMI_SIZE", "PMI_RANK",
               "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK")


def probe(code, **env_vars):
    """Run `import parallel` then `code` in a fresh interpreter with the given launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(env_vars, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", f"import parallel, sys, os\n{code}"], env=env,
                          capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()


THREADS_AND_REPORT = ("print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'), "
                      "os.environ.get('MKL_NUM_THREADS'))\n"
                      "print(parallel.launch.launch_report(parallel.comm.threads.single_rank_group()))")


@pytest.mark.parametrize("env, threads, says", [
    ({"MPI_LOCALNRANKS": "4"}, "1 1 1", "BLAS threads: 1 BLAS thread per rank (4 ranks share this machine)"),
    ({"PMI_SIZE": "2"}, "1 1 1", "BLAS threads: 1 BLAS thread per rank (2 ranks share this machine)"),
    ({"MPI_LOCALNRANKS": "4", "OPENBLAS_NUM_THREADS": "2"}, "2 1 1",
     "BLAS threads: as set by the user: OPENBLAS_NUM_THREADS=2"),
    ({}, "None None None", "BLAS threads: not limited: a single process"),
])
def test_blas_threads_are_limited_when_ranks_share_the_machine(env, threads, says):
    assert probe(THREADS_AND_REPORT, **env) == [threads, f"parallel: 1 rank(s) on the threads backend; {says}"]


def test_world_outside_mpiexec_does_not_import_mpi4py():
    assert probe("print(parallel.world().size, 'mpi4py' in sys.modules)") == ["1 False"]
