"""ZeRO-2 and ZeRO-3 under real `mpiexec -n 4`: the plain wrapper and the 3D job, against one device."""
import re
from pathlib import Path

from mpi_launch import requires_mpiexec, run_mpi

SCRIPT = Path(__file__).parent / "mpi_scripts" / "fully_sharded_equivalence.py"
pytestmark = requires_mpiexec


def test_zero_2_and_3_equal_one_device_on_four_real_ranks():
    result = run_mpi(4, [SCRIPT], timeout=300)  # ~15 s on a quiet machine: the bound only catches a hang
    assert sorted(re.findall(r"rank \d ok: 4 FullyShardedDataParallel runs", result.stdout)) == [
        f"rank {r} ok: 4 FullyShardedDataParallel runs" for r in range(4)]
    checks = re.findall(r"^layout (\d,\d,\d) zero (\d) check (\S+)$", result.stdout, re.MULTILINE)
    assert [(layout, stage) for layout, stage, _ in checks] == [("4,1,1", "3"), ("2,2,1", "3"), ("2,1,2", "2"),
                                                                ("2,1,2", "3")]
    assert all(float(worst) <= 1e-9 for _, _, worst in checks)
