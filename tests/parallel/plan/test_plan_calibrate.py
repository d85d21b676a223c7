"""Calibration: the worker's arithmetic on synthetic timings, the profile it writes, and the
worker under real mpiexec (2 ranks, parallel.world() ping-pong)."""
import json
import math

import pytest

import parallel.plan.calibrate as calibrate
from parallel import run_threads
from parallel.alpha_beta import send_recv
from parallel.launch import find_mpiexec
from parallel.plan.calibrate import calibrated_profile, measure
from parallel.plan.cost import link

ALPHA, BANDWIDTH = 3e-6, 2e9   # the synthetic link: 3 µs per message, 2 GB/s


def test_the_worker_recovers_alpha_and_bandwidth_from_ping_pong_times(monkeypatch, capsys):
    # Timings of a link that obeys the α–β model exactly: the figures must come back exactly,
    # and the profile built from them must reproduce the very times they were measured from.
    monkeypatch.setattr(calibrate, "matmul_flops", lambda dtype: {"float32": 4e9, "float64": 2e9}[dtype])
    monkeypatch.setattr(calibrate, "ping_pong_seconds", lambda group, nbytes, repeats: ALPHA + nbytes / BANDWIDTH)
    run_threads(2, calibrate.worker)
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["alpha_us"] == pytest.approx(ALPHA * 1e6 + 8 / BANDWIDTH * 1e6, rel=1e-12)
    large = 8 * 2**20
    # bandwidth = large / (t(large) − t(8 B)): the 8 B message's own transfer time is in α
    assert figures["bandwidth_gbps"] == pytest.approx(large / (large / BANDWIDTH - 8 / BANDWIDTH) / 1e9, rel=1e-12)
    assert figures["peak_flops"] == {"float32": 4e9, "float64": 2e9}

    profile = calibrated_profile(figures, "synthetic")
    assert profile["intra"] == {"alpha_us": figures["alpha_us"], "bandwidth_gbps": figures["bandwidth_gbps"]}
    assert profile["peak_flops"] == figures["peak_flops"] and profile["efficiency"] == 1.0
    _, alpha, beta = link(profile, 1, 2)
    # The α–β model from these figures reproduces the large message's time exactly, and the
    # 8-byte one's up to its 8 bytes, which α (the 8-byte time itself) already holds.
    assert send_recv(large, alpha, beta) == pytest.approx(ALPHA + large / BANDWIDTH, rel=1e-12)
    assert send_recv(8, alpha, beta) == pytest.approx(ALPHA + 8 / BANDWIDTH + 8 * beta, rel=1e-12)


def test_mpi_worker_measures_latency_and_bandwidth():
    if find_mpiexec() is None:
        pytest.skip("NO MPIEXEC next to sys.executable or on PATH: calibration worker not run")
    figures, note = measure()
    assert note == "measured with 2 MPI ranks"
    assert set(figures) == {"peak_flops", "alpha_us", "bandwidth_gbps"}
    assert set(figures["peak_flops"]) == {"float32", "float64"}
    # Measured times vary with the machine's load; only their kind is certain: positive and finite.
    for value in (figures["alpha_us"], figures["bandwidth_gbps"], *figures["peak_flops"].values()):
        assert value > 0 and math.isfinite(value)
