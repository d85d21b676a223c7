"""`python -m parallel.bench NAME [args...]`; with no NAME, list the benchmarks."""
import importlib
import pkgutil
import sys

import parallel.bench
from parallel.comm.checks import timeout_problem


def available():
    return sorted(m.name for m in pkgutil.iter_modules(parallel.bench.__path__) if not m.name.startswith("_"))


def main(argv):
    names = available()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown benchmark {argv[0]!r}", file=sys.stderr)
        print("usage: python -m parallel.bench NAME [args...]\nbenchmarks: " + ", ".join(names))
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    problem = timeout_problem(f"python -m parallel.bench {argv[0]}")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    return importlib.import_module(f"parallel.bench.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
