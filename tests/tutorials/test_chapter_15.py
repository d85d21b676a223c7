"""Chapter 15 (mixed precision): the scripts run (threads, and mpiexec for the scaler) and print
the evidence the README talks about; the numbers are parsed and checked."""
import re

import pytest
from chapter_runner import mpi, number_after, run_script

CH15 = "tutorials/15_mixed_precision/"


def test_underflow_without_scaling_exact_power_of_two_scaling_and_master_weights():
    out = run_script(CH15 + "underflow.py")
    assert "float16: largest 65504, smallest normal 6.1e-05, smallest subnormal 5.96e-08" in out
    flushed = {float(s): int(n.replace(",", "")) for s, n in re.findall(
        r"float16, loss scale +(\S+): flushed to zero +([\d,]+) of", out)}
    assert set(flushed) == {1, 256, 65536}
    assert flushed[1] > 1000 and flushed[256] < flushed[1] / 10 and flushed[65536] < flushed[256]
    errors = [float(e) for e in re.findall(r"relative to the largest gradient: (\S+)", out)]
    assert errors[0] > 10 * errors[2]  # scaling makes the float16 gradients more accurate, not just non-zero
    assert number_after("float64, scale 2^16 then unscale vs no scaling, largest difference:", out) == 0
    assert re.search(r"float16 weight 1\.0000, float32 master 0\.9000 \(exact 0\.9000\)", out)


@pytest.mark.parametrize("how", [{"threads": 4}, mpi(4)], ids=["threads4", "mpi4"])
def test_the_scaler_backs_off_grows_and_skips_the_injected_overflow_on_every_rank(how):
    out = run_script(CH15 + "scaler_trajectory.py", **how)
    steps = re.findall(r"^step +(\d+): loss scale 2\^(\d+) +(stepped|skipped)", out, re.MULTILINE)
    assert len(steps) == 16
    scales = [2.0 ** int(k) for _, k, _ in steps]
    skipped = [kind == "skipped" for _, _, kind in steps]
    assert scales[0] == 2.0**24 and skipped[0]
    for before, after, skip in zip(scales, scales[1:], skipped):  # the update rule, read off the printout
        assert after in (before / 2, before, before * 2) and (after == before / 2) == skip
    assert skipped[13] and not skipped[12] and scales[12] == scales[13]  # step 14: injected on one rank, skipped by all
    assert number_after("ranks with the same scale trajectory and skips:", out) == 4
