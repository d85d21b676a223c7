"""Compression hooks on real MPI ranks (mpiexec -n 2 and 4), on a simulated link."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

SCRIPT = Path(__file__).parents[1] / "mpi_scripts" / "compress_equivalence.py"
pytestmark = requires_mpiexec


@pytest.mark.parametrize("n", [2, 4])
def test_compressed_data_parallelism_equals_its_references_on_real_ranks(n):
    result = run_mpi(n, [SCRIPT], timeout=120)
    assert sorted(re.findall(r"rank \d+ ok: 4 references, 5 byte counts", result.stdout)) == [
        f"rank {r} ok: 4 references, 5 byte counts" for r in range(n)]
