"""A real network against the simulated one: two hosts on this machine (network namespaces
joined by a veth, parallel/bench/_hosts.py), the link shaped to a few rates. Root only.

    python -m parallel.bench network [--rates 100mbit 1gbit] [--steps 40]

For each rate:
  1. α and β fitted by least squares, t = α + β·bytes, on a sweep of message sizes across
     the hosts: send/recv (half a ping-pong's round trip) and a 2-rank all-reduce (whose
     α–β time is 2(α + N/2·β): its own fit is printed as the α, β that formula implies);
     β beside the β the rate sets, 8/rate seconds per byte;
  2. the main job's data-parallel step across the hosts (mpiexec, `--dp 2`), seconds per step;
  3. the same job on one host (2 ranks through shared memory) on `--link α,β` of the send/recv fit;
  4. `simulated/real step time: R`, and the share of the real step that communication takes
     (the real step minus the same job on one host without --link, over the real step).
"""
import argparse
import json
import re
import subprocess
import sys

import numpy as np

from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import timed_calls

from ..launch import find_mpiexec
from ..plan.calibrate import ping_pong
from . import slowest_median, together
from ._hosts import TwoHosts, can_make_hosts

SIZES = [2 ** k for k in range(10, 23, 2)]  # 1 KiB … 4 MiB
REPEATS = 9  # per size: the median of the slowest rank's times
STEP = re.compile(r"trained (\d+) steps in \S+ \(([\d.]+) s\)")


def main(argv):
    parser = bench_parser("python -m parallel.bench network", __doc__, steps=40, blas_threads=False)
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], help="link rates, tc syntax")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return run_bench(parser, argv, run)


def run(args):
    if args.worker:
        return measure_sizes()
    problem = can_make_hosts()
    if problem:
        print(f"python -m parallel.bench network: {problem}; it needs two network namespaces (run as root)",
              file=sys.stderr)
        return 2
    local = step_seconds(one_host(args.steps))
    print(f"one host, 2 ranks through shared memory, --dp 2: {local * 1e3:.1f} ms/step")
    for rate in args.rates:
        with TwoHosts(rate=rate) as hosts:
            report_rate(hosts, rate, args.steps, local)
    return 0


def report_rate(hosts, rate, steps, local):
    sweep = json.loads(hosts.mpiexec(["-m", "parallel.bench", "network", "--worker"], timeout=600).stdout)
    p2p = fit(sweep["sizes"], sweep["send_recv"])
    ring = fit(sweep["sizes"], sweep["all_reduce"])
    print(f"\nlink shaped to {rate}: β set = {8 / rate_bits(rate) * 1e9:.2f} ns/B")
    print("  " + "  ".join(f"{n // 1024:>6} KiB" for n in sweep["sizes"]))
    for name in ("send_recv", "all_reduce"):
        print("  " + "  ".join(f"{t * 1e3:>7.2f} ms" for t in sweep[name]) + f"  {name.replace('_', '/', 1)}")
    print(f"  send/recv   α = {p2p[0] * 1e6:8.1f} µs  β = {p2p[1] * 1e9:7.2f} ns/B")
    print(f"  all-reduce  α = {ring[0] / 2 * 1e6:8.1f} µs  β = {ring[1] * 1e9:7.2f} ns/B   (fit of 2(α + N/2·β))")
    real = step_seconds(hosts.mpiexec(["-m", "mpi4py", "-m", "parallel.train", *train_flags(steps)], timeout=1800))
    link = f"{p2p[0]:.3e},{p2p[1]:.3e}"
    simulated = step_seconds(one_host(steps, f"--link={link}"))
    print(f"  real step across the hosts {real * 1e3:.1f} ms; simulated on --link {link} {simulated * 1e3:.1f} ms; "
          f"communication {max(0.0, real - local) / real:.0%} of the real step")
    print(f"  simulated/real step time: {simulated / real:.2f}")


def train_flags(steps):
    """`python -m parallel.train`'s flags: the default task, data parallel over 2 ranks, `steps` steps."""
    return ["--dp", "2", "--steps", str(steps), "--log-every", str(steps)]


def one_host(steps, *extra):
    """The job as 2 MPI processes on this host, talking through shared memory (`extra`: --link
    ...): the real job's ranks, without the network."""
    return subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "parallel.train",
                           *train_flags(steps), *extra], capture_output=True, text=True)


def step_seconds(run):
    """Seconds per step from parallel.train's 'trained N steps in ... (S s)' line."""
    match = STEP.search(run.stdout)
    if run.returncode != 0 or match is None:
        raise RuntimeError(f"the training job failed ({run.returncode}):\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return float(match.group(2)) / int(match.group(1))


def rate_bits(rate):
    return float(rate.lower().replace("gbit", "e9").replace("mbit", "e6").replace("kbit", "e3"))


def fit(sizes, seconds):
    """(α, β) of t = α + β·bytes by least squares, with α ≥ 0. The large messages weigh most,
    as they do in a training step; the token bucket lets a small message through at line
    speed (its burst), which would bend a fit on relative error towards too small a β."""
    n, t = np.array(sizes, float), np.array(seconds)
    beta, alpha = np.polyfit(n, t, 1)
    if alpha < 0:  # the best line crosses below zero: α = 0, β alone
        alpha, beta = 0.0, float(n @ t / (n @ n))
    return float(alpha), float(beta)


def measure_sizes():
    """Under mpiexec on 2 ranks: the median one-way send/recv time and all-reduce time per size,
    printed by rank 0 as one JSON object."""
    import parallel
    group = parallel.world()
    result = {"sizes": SIZES, "send_recv": [], "all_reduce": []}

    def median(call):
        return slowest_median(group, timed_calls(call, REPEATS, before=together(group)))

    for nbytes in SIZES:
        buf = np.zeros(nbytes // 4, np.float32)
        result["send_recv"].append(median(lambda: ping_pong(group, buf)) / 2)
        result["all_reduce"].append(median(lambda: group.all_reduce(buf)))
    if group.rank == 0:
        print(json.dumps(result), flush=True)
    return 0
