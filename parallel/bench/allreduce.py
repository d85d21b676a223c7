"""All-reduce: MPI's own against the from-scratch ring (parallel/comm/ring.py), on 2 and 4 ranks.

    python -m parallel.bench allreduce [--ranks 2 4] [--max-mib 64]

Launches itself under mpiexec once per rank count and prints, per buffer size,
the median time over repetitions (each repetition timed as its slowest rank, after one untimed)
and the bus bandwidth as nccl-tests defines it:

    algbw = bytes / time        busbw = algbw * 2(n-1)/n

busbw is what each rank's link carries, so it is comparable across n.
"""
import argparse

from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import timed_calls
from minitensor.flags import AT_LEAST_1
from parallel.bench import run_workers, slowest_median, together

KIB, MIB = 1024, 1024 * 1024


def main(argv):
    parser = bench_parser("python -m parallel.bench allreduce", __doc__, blas_threads=False)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="rank counts to run (default 2 4)")
    parser.add_argument("--max-mib", type=int, default=64, help="largest buffer in MiB (default 64)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return run_bench(parser, argv, run, {"ranks": AT_LEAST_1, "max_mib": AT_LEAST_1})


def run(args):
    if args.worker:
        return run_worker(args.max_mib * MIB)
    for n in args.ranks:
        print(run_workers(n, "allreduce", args, "--max-mib", args.max_mib), end="")
    return 0


def repetitions(nbytes):
    """Enough repetitions for a stable median, without making the large sizes take minutes."""
    return max(5, min(100, (64 * MIB) // max(nbytes, 1) // 4))


def run_worker(max_bytes):
    import numpy as np

    import parallel
    group = parallel.world()
    n = group.size
    sizes = [KIB * 4 ** k for k in range(20) if KIB * 4 ** k <= max_bytes]
    if group.rank == 0:
        print(parallel.launch.launch_report(group))
        print(f"all-reduce of float32 on {n} ranks; busbw = bytes/time * 2(n-1)/n")
        print(f"{'size':>8} {'MPI time':>11} {'MPI busbw':>11} {'ring time':>11} {'ring busbw':>11} {'ring/MPI':>9}")
    for nbytes in sizes:
        buf = np.zeros(nbytes // 4, np.float32)
        reps = repetitions(nbytes)
        # one untimed call first: first-touch pages, MPI connection setup
        mpi = slowest_median(group, timed_calls(lambda: group.all_reduce(buf), reps, before=together(group)))
        ring = slowest_median(group, timed_calls(lambda: group.all_reduce(buf, algorithm="ring"), reps,
                                                 before=together(group)))
        if group.rank == 0:
            bus = lambda t: nbytes / t * 2 * (n - 1) / n / 1e9
            print(f"{human(nbytes):>8} {mpi * 1e3:>8.3f} ms {bus(mpi):>6.2f} GB/s {ring * 1e3:>8.3f} ms "
                  f"{bus(ring):>6.2f} GB/s {ring / mpi:>8.2f}x", flush=True)
    return 0


def human(nbytes):
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"
