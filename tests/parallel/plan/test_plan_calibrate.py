"""The calibration worker under real mpiexec: 2 ranks, parallel.world() ping-pong."""
import pytest

from parallel.launch import find_mpiexec
from parallel.plan.calibrate import measure


def test_mpi_worker_measures_latency_and_bandwidth():
    if find_mpiexec() is None:
        pytest.skip("NO MPIEXEC next to sys.executable or on PATH: calibration worker not run")
    figures, note = measure()
    assert note == "measured with 2 MPI ranks"
    assert 0 < figures["alpha_us"] < 1e4
    assert figures["bandwidth_gbps"] > 0.01
    assert figures["peak_flops"]["float32"] > 1e8 and figures["peak_flops"]["float64"] > 1e8
