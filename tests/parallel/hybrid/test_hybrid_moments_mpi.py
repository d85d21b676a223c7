"""bfloat16 AdamW moments under real mpiexec: `python -m parallel.train --check --moment-dtype
bfloat16` on 4 ranks (dp, tp, pp, ZeRO 0-3) equals one device keeping its moments in bfloat16."""
import re

import pytest
from mpi_launch import requires_mpiexec, run_mpi

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "16", "--digits", "2", "--steps", "4",
        "--moment-dtype", "bfloat16", "--check", "4"]


DEEP = pytest.mark.deep  # the threads' test (test_hybrid_moments.py) covers every layout every day


@requires_mpiexec
@pytest.mark.parametrize("layout", [
    ["--dp", "2", "--tp", "2", "--zero", "1"], ["--dp", "4", "--zero", "3"],
    pytest.param(["--dp", "2", "--tp", "2", "--zero", "0"], marks=DEEP),
    pytest.param(["--dp", "2", "--pp", "2", "--microbatches", "2", "--zero", "2"], marks=DEEP),
    pytest.param(["--tp", "2", "--pp", "2", "--microbatches", "2"], marks=DEEP)])
def test_bf16_moments_on_four_ranks_equal_one_device_with_bf16_moments(layout):
    result = run_mpi(4, ["-m", "parallel.train", *TINY, *layout], timeout=240)
    worst = float(re.search(r"largest relative difference to one device over 4 step\(s\): (\S+)",
                            result.stdout).group(1))
    assert worst <= 1e-12, (layout, result.stdout)
