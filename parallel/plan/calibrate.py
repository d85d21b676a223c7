"""Measure this machine and write a "laptop-cpu-calibrated" device profile.

    python -m parallel.plan --calibrate [--output PATH]

Runs `mpiexec -n 2 <python> -m mpi4py -m parallel.plan.calibrate --worker` with one
BLAS thread per rank (the way training runs share a laptop's cores). In the worker,
each rank times large float32 and float64 matmuls while the other does the same, then
rank 0 and 1 ping-pong over `parallel.world()`: tiny messages give the latency α,
large ones the bandwidth. Without mpiexec the matmul part runs alone and the link
figures stay the laptop-cpu defaults (said so in the output and the profile).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..comm.checks import timeout_problem
from ..launch import BLAS_THREAD_VARS, run_on_mpi_ranks
from .profiles import cache_dir, packaged_profiles

ONE_THREAD = {name: "1" for name in BLAS_THREAD_VARS}
TIMEOUT_S = 60


def best_seconds(run, min_total=0.2, min_repeats=3):
    """Fastest of repeated calls of run(), repeating until min_total seconds have passed."""
    best, spent, repeats = float("inf"), 0.0, 0
    while spent < min_total or repeats < min_repeats:
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        best, spent, repeats = min(best, elapsed), spent + elapsed, repeats + 1
    return best


def matmul_flops(dtype, n=512):
    """Achieved flop/s of an n×n @ n×n matmul (2·n³ flops)."""
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    return 2 * n ** 3 / best_seconds(lambda: a @ b)


def ping_pong(group, buf):
    """One round trip of `buf` between ranks 0 and 1: rank 0 sends first, rank 1 answers."""
    peer = 1 - group.rank
    if group.rank == 0:
        group.send(buf, peer)
        group.recv(buf, peer)
    else:
        group.recv(buf, peer)
        group.send(buf, peer)


def ping_pong_seconds(group, nbytes, repeats):
    """One-way time of an nbytes message between ranks 0 and 1 (half the round trip)."""
    import numpy as np
    buf = np.zeros(max(1, nbytes // 4), dtype=np.float32)

    def round_trip():
        for _ in range(repeats):
            ping_pong(group, buf)
    round_trip()                                   # warm up the connection
    group.barrier()
    # a fixed count of timed trips, not "until 0.1 s passed": each rank would decide for itself,
    # and a rank that stopped one trip early left its peer waiting for (or mistaking) a message
    return best_seconds(round_trip, min_total=0.0, min_repeats=5) / repeats / 2


def worker():
    """Runs on each of 2 MPI ranks; rank 0 prints the figures as one JSON line."""
    from parallel import world
    group = world()
    if group.size != 2:
        raise ValueError(f"the calibration worker needs exactly 2 ranks, got {group.size}")
    flops = {"float32": matmul_flops("float32"), "float64": matmul_flops("float64")}
    group.barrier()
    alpha = ping_pong_seconds(group, 8, repeats=200)
    large = 8 * 2**20
    one_way = ping_pong_seconds(group, large, repeats=5)
    bandwidth = large / max(one_way - alpha, 1e-12)
    if group.rank == 0:
        print(json.dumps({"peak_flops": flops, "alpha_us": alpha * 1e6,
                          "bandwidth_gbps": bandwidth / 1e9}))


def run_json(command):
    env = {**os.environ, **ONE_THREAD}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure():
    """(figures, note): MPI worker figures, or matmul only with a note saying why."""
    try:
        output = run_on_mpi_ranks(2, "parallel.plan.calibrate", "--worker", timeout=TIMEOUT_S)
        return json.loads(output.strip().splitlines()[-1]), "measured with 2 MPI ranks"
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as error:
        note = f"MPI measurement failed, link figures are the laptop-cpu defaults: {error}"
    print(f"WARNING: {note}", file=sys.stderr)
    return run_json([sys.executable, "-m", "parallel.plan.calibrate", "--matmul"]), note


def calibrated_profile(figures, note):
    profile = dict(packaged_profiles()["laptop-cpu"])
    devices = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    profile.update(
        name="laptop-cpu-calibrated",
        description=f"this machine, one BLAS thread per rank; {note}. peak_flops is the "
                    "measured 512×512 matmul rate, so efficiency 1.0 treats a step as running "
                    "at that rate (an upper bound)",
        peak_flops=figures["peak_flops"], efficiency=1.0, devices_per_node=devices,
        memory_gib=round(memory / devices, 2))
    if "alpha_us" in figures:
        profile["intra"] = {"alpha_us": figures["alpha_us"],
                            "bandwidth_gbps": figures["bandwidth_gbps"]}
    return profile


def check_writable(path):
    """A ValueError naming `path` if the profile cannot be written there (tried: its directory made,
    the file opened for appending, and removed again if it was new)."""
    existed = path.exists()
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
        path.open("a").close()
    except OSError as error:
        raise ValueError(f"--output {path} cannot be written ({error.strerror}): give a writable file path") from None
    if not existed:
        path.unlink()


def calibrate(output=None):
    """Measure, write the profile JSON to `output` (default: the cache dir), return it."""
    path = Path(output) if output else cache_dir() / "laptop-cpu-calibrated.json"
    check_writable(path)  # before the minute of measuring
    problem = timeout_problem("python -m parallel.plan --calibrate")  # its MPI ranks read it
    if problem:
        raise ValueError(problem.split(": error: ", 1)[1])
    profile = calibrated_profile(*measure())
    path.write_text(json.dumps(profile, indent=2) + "\n")
    flops = ", ".join(f"{k} {v / 1e9:.3g} GFLOP/s" for k, v in profile["peak_flops"].items())
    print(f"matmul (one BLAS thread): {flops}")
    print(f"intra-node link: α = {profile['intra']['alpha_us']:.3g} µs, "
          f"bandwidth = {profile['intra']['bandwidth_gbps']:.3g} GB/s")
    print(f"wrote {path}; use it with --device laptop-cpu-calibrated (or --device {path})")
    return profile


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    elif sys.argv[1:] == ["--matmul"]:
        print(json.dumps({"peak_flops": {"float32": matmul_flops("float32"),
                                         "float64": matmul_flops("float64")}}))
    else:
        sys.exit("usage: python -m parallel.plan.calibrate --worker | --matmul "
                 "(or python -m parallel.plan --calibrate)")
