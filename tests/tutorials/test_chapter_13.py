"""Chapter 13 (local SGD and staleness): the scripts run (threads, and mpiexec for the
parameter server) and print the evidence the README talks about; the numbers are parsed and
checked. The parameter server runs on a virtual clock: nothing here depends on timing."""
import re

import pytest
from chapter_runner import mpi, number_after, run_script

CH13 = "tutorials/13_local_sgd_and_staleness/"
TIMEOUT = 600  # a few seconds to a minute on a quiet machine; these train small models


def test_local_sgd_pins_the_sign_and_cuts_bytes_by_h():
    out = run_script(CH13 + "local_sgd.py", timeout=TIMEOUT, threads=2)
    assert number_after("largest relative parameter difference", out) < 1e-12
    assert number_after("bytes per step, H = 1 / H = 16:", out) == pytest.approx(16, rel=0.01)
    strides = {setting: float(stride) for setting, stride in re.findall(
        r"outer lr (\d\.\d, momentum \d\.\d): stride ([0-9.]+)", out)}
    assert strides["1.0, momentum 0.0"] == 1.0  # no momentum, lr 1: the anchor lands on the mean replica
    assert strides["0.7, momentum 0.9"] > 2 * strides["0.1, momentum 0.9"]  # the momentum multiplies the stride


@pytest.mark.parametrize("how", [{"threads": 4}, mpi(4)], ids=["threads4", "mpi4"])
def test_staleness_trades_waiting_for_stale_gradients_and_replays(how):
    out = run_script(CH13 + "staleness.py", "--steps", "30", timeout=TIMEOUT, **how)
    rows = re.findall(r"s = (\d): virtual time +([0-9.]+), mean staleness ([0-9.]+) rounds, final loss ([0-9.]+), "
                      r"replayed bit for bit in one process: (\w+)", out)
    assert [int(r[0]) for r in rows] == [0, 1, 2, 4]
    times, lags = [float(r[1]) for r in rows], [float(r[2]) for r in rows]
    assert lags[0] == 0 and lags == sorted(lags) and lags[-1] > 0
    assert times == sorted(times, reverse=True) and times[-1] < times[0]
    assert all(r[4] == "True" for r in rows)
    assert number_after("s = 0 vs synchronous training on one device, largest relative difference:", out) < 1e-9
