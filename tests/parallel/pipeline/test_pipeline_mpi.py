"""The pipeline executor on real MPI ranks: `mpiexec -n 2` and `-n 4`, every schedule."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

SCRIPTS = Path(__file__).parents[1] / "mpi_scripts"
pytestmark = requires_mpiexec


@pytest.mark.parametrize("n", [2, 4])
def test_every_schedule_equals_one_device_on_real_ranks(n):
    result = run_mpi(n, [SCRIPTS / "pp_equivalence.py"], timeout=120)
    assert sorted(re.findall(r"rank \d+ ok", result.stdout)) == [f"rank {r} ok" for r in range(n)]
