"""Chapter 3, part 3: time all-reduce from 1 KiB up, compute bus bandwidth, fit the α–β model.

    python tutorials/03_collectives/bandwidth.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/03_collectives/bandwidth.py [--algorithm ring] [--max-kib 16384]

The α–β model of a ring all-reduce of m bytes on n ranks: 2(n-1) steps, each
paying a latency α and moving a chunk of m/n bytes at β seconds per byte:

    t(m) = 2(n-1)·α + 2(n-1)/n · m · β

The script fits α and β to the measured medians (least squares on relative
error, so small and large sizes count alike) and prints the model next to the
measurements.
"""
import parallel
import numpy as np
from minitensor.bench_timing import timed_calls
from parallel.bench import slowest_median, together
from parallel.bench.allreduce import KIB, human, repetitions


def measure(group, algorithm, max_bytes):
    """(bytes, median seconds) for float32 buffers of 1 KiB, 4 KiB, ... up to max_bytes."""
    sizes = [KIB * 4 ** k for k in range(20) if KIB * 4 ** k <= max_bytes]
    times = []
    for nbytes in sizes:
        buf = np.zeros(nbytes // 4, np.float32)
        times.append(slowest_median(group, timed_calls(lambda: group.all_reduce(buf, algorithm=algorithm),
                                                       repetitions(nbytes), before=together(group))))
    return np.array(sizes, dtype=float), np.array(times)


def fit_alpha_beta(sizes, times, n):
    """α (s) and β (s/byte) of t = 2(n-1)α + 2(n-1)/n·m·β, minimising Σ((model − t)/t)²."""
    steps = 2 * (n - 1)
    design = np.stack([np.full_like(sizes, steps), steps / n * sizes], axis=1) / times[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    return alpha, beta


def main(args):
    group = parallel.world()
    n = group.size
    if n < 2:
        raise SystemExit("bandwidth.py needs at least 2 ranks: --threads 2, or mpiexec -n 2")
    sizes, times = measure(group, args.algorithm, args.max_kib * KIB)
    if group.rank != 0:
        return
    print(parallel.launch.launch_report(group))
    alpha, beta = fit_alpha_beta(sizes, times, n)
    model = 2 * (n - 1) * alpha + 2 * (n - 1) / n * sizes * beta
    busbw = sizes / times * 2 * (n - 1) / n
    print(f"all-reduce ({args.algorithm}) of float32 on {n} ranks; median of repetitions, slowest rank")
    print("algbw = bytes/time, busbw = algbw * 2(n-1)/n (what each rank's link carries)\n")
    print(f"{'size':>8} {'time':>11} {'algbw':>11} {'busbw':>11} {'model':>11}  model/measured")
    for m, t, bus, fit in zip(sizes, times, busbw, model):
        print(f"{human(int(m)):>8} {t * 1e6:>8.1f} us {m / t / 1e9:>6.3f} GB/s {bus / 1e9:>6.3f} GB/s "
              f"{fit * 1e6:>8.1f} us  {fit / t:>6.2f}")
    print(f"\nbusbw of the smallest size: {busbw[0] / 1e9:.4f} GB/s")
    print(f"busbw of the largest size: {busbw[-1] / 1e9:.4f} GB/s")
    print(f"fitted alpha (latency per step): {alpha * 1e6:.2f} us")
    print(f"fitted beta: {beta * 1e9:.4f} ns/byte, i.e. a link bandwidth 1/beta of {1 / beta / 1e9:.3f} GB/s")
    half = n * alpha / beta  # where the latency term equals the bandwidth term
    print(f"latency and bandwidth cost the same at m = n*alpha/beta: {half / KIB:.1f} KiB "
          f"(smaller messages are latency-bound, larger ones bandwidth-bound)")
    print(f"largest model/measured ratio: {np.max(np.maximum(model / times, times / model)):.2f}")
    return dict(sizes=sizes, times=times, alpha=alpha, beta=beta, n=n)  # what tutorials/pictures/ draws


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--algorithm", choices=["builtin", "ring"], default="builtin",
                        help="the backend's own all-reduce, or the from-scratch ring (default builtin)")
    parser.add_argument("--max-kib", type=int, default=16 * 1024, help="largest buffer in KiB (default 16384)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
