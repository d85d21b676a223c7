"""Benchmarks: `python -m parallel.bench NAME [args...]` runs `parallel.bench.NAME.main(argv)`.

A benchmark is any module in this folder with a `main(argv)`; the dispatcher
lists them by scanning the folder, so adding one needs no registration. Each builds its
command line with minitensor.bench_cli and times with minitensor.bench_timing; what the
ranks of one job add is here: ranks starting each timed call together (`together`), the slowest
rank's time (`slowest_median`), a worker
job launched with the shared flags (`run_workers`) and its figures reported back.
"""
import json

from minitensor.bench_cli import shared_flags
from parallel.launch import run_on_mpi_ranks

RESULT = "bench-result "  # a worker rank prints its figures on one line with this prefix


def report(figures):
    """Print `figures` (JSON-able) for the launching process to collect."""
    print(RESULT + json.dumps(figures), flush=True)


def collect(stdout):
    """Every figure a worker job reported, in order."""
    return [json.loads(line[len(RESULT):]) for line in stdout.splitlines() if line.startswith(RESULT)]


def together(group, before=tuple):
    """A before() for timed_calls that runs `before` and then a barrier, so that every rank
    starts each timed call at once; returns what `before` returned (the call's arguments)."""
    def lined_up():
        args = before()
        group.barrier()
        return args
    return lined_up


def slowest_median(group, times):
    """The median over timed calls of the slowest rank's seconds (an all-reduce of `times`)."""
    import numpy as np
    times = np.array(times)
    group.all_reduce(times, op="max")
    return float(np.median(times))


def run_workers(n, name, args, *flags):
    """`python -m parallel.bench NAME --worker FLAGS` and the shared flags of `args` (steps,
    warm-up, BLAS threads) on n MPI ranks: the job's standard output."""
    return run_on_mpi_ranks(n, "parallel.bench", name, "--worker", *flags, *shared_flags(args))


def run_layouts(name, layouts, ranks, args):
    """Benchmark `name`'s worker (`--worker LAYOUT`) on ranks[layout] MPI ranks for each of
    `layouts` in turn: every figure the jobs reported, in order."""
    return [figures for layout in layouts for figures in collect(run_workers(ranks[layout], name, args, layout))]
