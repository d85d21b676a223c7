"""Context parallelism on real MPI ranks: ring attention and `parallel.train --cp --check`
under `mpiexec -n 4` (cp 4; cp 2 x tp 2 with SP; Ulysses cp 4) and `-n 8` (cp 2 x tp 2 x dp 2, ZeRO)."""
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

SCRIPT = Path(__file__).parents[1] / "mpi_scripts" / "cp_layouts.py"
pytestmark = requires_mpiexec


@pytest.mark.parametrize("ranks, layouts", [(4, ["1,1,1,4", "1,2,1,2", "1,1,1,4"]), (8, ["2,2,1,2"])])
def test_ring_attention_and_the_cp_layouts_pass_the_single_device_check(ranks, layouts):
    # a few seconds on a quiet machine: the 300 s bound only catches a hang
    out = run_mpi(ranks, [SCRIPT], timeout=300).stdout
    assert re.findall(r"^ring (\S+) causal=(\S+) ok$", out, re.M) == [
        ("zigzag", "True"), ("zigzag", "False"), ("contiguous", "True"), ("contiguous", "False")]
    checks = re.findall(r"^layout (\S+) check (\S+)$", out, re.M)
    assert [layout for layout, _ in checks] == layouts
    assert all(float(worst) <= 1e-9 for _, worst in checks)
    assert "mesh dp=1 x tp=2 x pp=1 x cp=2 over 4 ranks" in out or ranks == 8
