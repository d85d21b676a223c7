"""Benchmarks: `python -m parallel.bench NAME [args...]` runs `parallel.bench.NAME.main(argv)`.

A benchmark is any module in this folder with a `main(argv)`; the dispatcher
lists them by scanning the folder, so adding one needs no registration.
"""
import json

from parallel.launch import run_on_mpi_ranks

RESULT = "bench-result "  # a worker rank prints its figures on one line with this prefix


def report(figures):
    """Print `figures` (JSON-able) for the launching process to collect."""
    print(RESULT + json.dumps(figures), flush=True)


def collect(stdout):
    """Every figure a worker job reported, in order."""
    return [json.loads(line[len(RESULT):]) for line in stdout.splitlines() if line.startswith(RESULT)]


def run_layouts(name, layouts, ranks, steps, warmup):
    """Benchmark `name`'s worker (`--worker LAYOUT`) on ranks[layout] MPI ranks for each of
    `layouts` in turn: every figure the jobs reported, in order."""
    return [figures for layout in layouts
            for figures in collect(run_on_mpi_ranks(ranks[layout], "parallel.bench", name, "--worker", layout,
                                                    "--steps", steps, "--warmup", warmup))]
