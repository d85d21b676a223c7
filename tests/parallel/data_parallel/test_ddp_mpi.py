"""DataParallel and ZeRO-1 under real `mpiexec -n 2` and `-n 4`, checked against one device."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

SCRIPT = Path(__file__).parents[1] / "mpi_scripts" / "dp_equivalence.py"
pytestmark = requires_mpiexec


@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_and_zero_equal_one_device_on_real_ranks(n):
    result = run_mpi(n, [SCRIPT], timeout=60)
    # Ranks share one stdout, so their lines may interleave: look for each rank's message anywhere.
    assert sorted(re.findall(r"rank \d+ ok: 3 DataParallel and 2 ZeRO-1 runs", result.stdout)) == [
        f"rank {r} ok: 3 DataParallel and 2 ZeRO-1 runs" for r in range(n)]
