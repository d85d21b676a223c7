"""The command line every benchmark shares (`python -m minitensor.bench`, `python -m parallel.bench NAME`).

    parser = bench_parser("python -m parallel.bench dp", __doc__, steps=8, warmup=2)
    parser.add_argument(...)                       # the benchmark's own flags
    return run_bench(parser, argv, run)            # in main(argv): parse, check, run(args)

The shared flags: `--steps N` timed calls after `--warmup N` untimed ones (for a benchmark
that passes their defaults), and `--blas-threads N` (default 1: one BLAS thread, as each rank
under mpiexec gets; a benchmark that does no BLAS work leaves it out). `run_bench` checks every
numeric flag before any work (minitensor.flags: one line, exit 2), then calls run(args) on
that many BLAS threads and returns its exit code. `shared_flags(args)` hands the shared
flags on to a benchmark's worker processes; `threads_note(args)` says in a header what was set.
"""
import argparse

from minitensor.flags import AT_LEAST_0, AT_LEAST_1, parse_checked
from minitensor.kernel_threads import blas_threads_of

SHARED_RULES = {"steps": AT_LEAST_1, "warmup": AT_LEAST_0, "blas_threads": AT_LEAST_1}


def bench_parser(prog, doc, steps=None, warmup=None, blas_threads=True):
    """An argument parser for the benchmark `prog`, its help the module's docstring `doc`, with
    --steps and --warmup when given their defaults, and --blas-threads unless told not to."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps, help=f"timed steps (default {steps})")
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup,
                            help=f"untimed steps before the timed ones (default {warmup})")
    if blas_threads:
        parser.add_argument("--blas-threads", type=int, default=1,
                            help="BLAS threads (per rank) while timing (default 1)")
    return parser


def run_bench(parser, argv, run, rules=None):
    """run(args) on --blas-threads BLAS threads, after parsing argv and checking the shared
    numeric flags and `rules` ({dest: rule}, minitensor.flags); returns run's exit code."""
    shared = {dest: rule for dest, rule in SHARED_RULES.items() if parser.get_default(dest) is not None}
    args = parse_checked(parser, argv, {**shared, **(rules or {})})
    with blas_threads_of(getattr(args, "blas_threads", None)):
        return run(args)


def shared_flags(args):
    """The shared flags of `args` as command-line words, for a worker process to parse alike."""
    return [f"--{dest.replace('_', '-')}={getattr(args, dest)}" for dest in SHARED_RULES if hasattr(args, dest)]


def threads_note(args):
    """"1 BLAS thread per rank" (or N threads), for a benchmark's header."""
    return f"{args.blas_threads} BLAS thread{'s' if args.blas_threads > 1 else ''} per rank"
