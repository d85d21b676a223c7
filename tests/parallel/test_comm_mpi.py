"""parallel.comm's MPI backend on real ranks: `mpiexec -n 2` and `-n 4` in a subprocess with a timeout."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

SCRIPTS = Path(__file__).parent / "mpi_scripts"
pytestmark = requires_mpiexec


@pytest.mark.parametrize("n", [2, 4])
def test_every_operation_on_real_ranks(n):
    result = run_mpi(n, [SCRIPTS / "collectives.py"], timeout=120)
    assert sorted(re.findall(r"rank \d+ ok", result.stdout)) == [f"rank {r} ok" for r in range(n)]
    assert f"parallel: {n} rank(s) on the mpi backend; BLAS threads:" in result.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_an_exception_on_one_rank_ends_the_whole_job(n):
    # a hang fails in run_mpi's timeout (the job ends in ~2 s on a quiet machine: 30x margin)
    result = run_mpi(n, [SCRIPTS / "failures.py", "raise"], timeout=60, check=False)
    assert result.returncode != 0
    assert f"ValueError: rank {n - 1} failed on purpose" in result.stderr


def test_recv_into_the_wrong_buffer_names_both_shapes_and_dtypes():
    result = run_mpi(2, [SCRIPTS / "failures.py", "bad_recv"], timeout=60, check=False)
    assert result.returncode != 0
    assert ("ValueError: recv: the message from rank 0 (tag 7) has shape (3,) and dtype float64, "
            "but the receive buffer has shape (4,) and dtype float32") in result.stderr


def test_a_bad_mesh_fails_on_every_rank():
    result = run_mpi(4, [SCRIPTS / "failures.py", "bad_mesh"], timeout=60)
    assert sorted(result.stdout.splitlines()) == [
        f"rank {r}: Mesh: dp=4 x tp=2 x pp=1 = 8 ranks, but the world has 4" for r in range(4)]
