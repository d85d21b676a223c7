"""The tensor-parallel GPT against one device on real ranks: `mpiexec -n 2` and `-n 4`."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

SCRIPT = Path(__file__).resolve().parents[1] / "mpi_scripts" / "tp_equivalence.py"
pytestmark = requires_mpiexec


@pytest.mark.parametrize("n", [2, 4])
def test_TensorParallelGPT_equals_one_device_under_mpiexec(n):
    result = run_mpi(n, [SCRIPT], timeout=120)
    layouts = f"tp={n} sp=False, tp={n} sp=True" + (", mesh dp=2 tp=2 sp=True" if n == 4 else "")
    assert sorted(re.findall(r"rank \d+ ok \[[^]]*\]", result.stdout)) == [f"rank {r} ok [{layouts}]" for r in range(n)]
