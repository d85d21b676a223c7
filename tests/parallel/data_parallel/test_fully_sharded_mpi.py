"""ZeRO-2 and ZeRO-3 under real `mpiexec -n 4`: the plain wrapper and the 3D job, against one device."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

from minitensor import dtypes

SCRIPT = Path(__file__).parents[1] / "mpi_scripts" / "fully_sharded_equivalence.py"
pytestmark = requires_mpiexec


def test_zero_2_and_3_equal_one_device_on_four_real_ranks():
    result = run_mpi(4, [SCRIPT], timeout=300)  # ~15 s on a quiet machine: the bound only catches a hang
    assert sorted(re.findall(r"rank \d ok: 4 FullyShardedDataParallel runs", result.stdout)) == [
        f"rank {r} ok: 4 FullyShardedDataParallel runs" for r in range(4)]
    checks = re.findall(r"^layout (\d,\d,\d) zero (\d) check (\S+)$", result.stdout, re.MULTILINE)
    assert [(layout, stage) for layout, stage, _ in checks] == [("4,1,1", "3"), ("2,2,1", "3"), ("2,1,2", "2"),
                                                                ("2,1,2", "3")]
    assert all(float(worst) <= 1e-9 for _, _, worst in checks)


TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "16", "--digits", "2"]


@pytest.mark.parametrize("precision, stage, tolerance", [
    ("fp16", "2", "0.01"), pytest.param("bf16", "3", "0.08", marks=pytest.mark.skipif(
        dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: the bfloat16 MPI test did NOT run !!!"))])
def test_zero_2_and_3_under_a_16_bit_policy_equal_one_device_on_four_real_ranks(precision, stage, tolerance):
    # the float32 master chunks stay put; the 16-bit copies cross real MPI in the all-gathers
    # (bfloat16 as its bits), the gradients in float32 reduce-scatters
    result = run_mpi(4, ["-m", "parallel.train", "--dp", "2", "--tp", "2", "--microbatches", "2", "--zero", stage,
                         "--precision", precision, "--check", "2", "--steps", "2", *TINY], timeout=120)
    worst = re.search(rf"^check: largest relative difference to one device over 2 step\(s\): (\S+) \(tolerance "
                      rf"{tolerance} under the same policy, {precision}\)$", result.stdout, re.MULTILINE)
    assert worst and float(worst.group(1)) <= float(tolerance), result.stdout
    assert re.search(r"^  dp reduce_scatter +\d+ calls", result.stdout, re.MULTILINE)
