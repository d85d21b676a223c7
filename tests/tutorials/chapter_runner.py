"""Run a tutorial chapter's script the way its README tells a reader to, and return what it printed.

    from chapter_runner import run_script, number_after

    out = run_script("tutorials/01_autograd/gradcheck_and_graph.py")
    out = run_script("tutorials/03_collectives/ring_allreduce.py", threads=2)      # ... --threads 2
    out = run_script("tutorials/03_collectives/ring_allreduce.py", mpi_ranks=2)    # mpiexec -n 2 ... -m mpi4py

`run_script(path, *args, timeout=120, mpi_ranks=None, threads=None) -> str`:
`path` is relative to the repository root (or absolute); `threads=N` appends
`--threads N` to the arguments; `mpi_ranks=N` runs the script under real
`mpiexec -n N` through tests/mpi_launch.py's `run_mpi` (skipping loudly when
there is no mpiexec). Both ways run with one BLAS thread unless the
environment sets OPENBLAS_NUM_THREADS. A non-zero exit or a timeout fails the test with the
script's stdout and stderr. The tests then parse the evidence lines out of the
returned stdout, with `number_after` for "label: <number>" lines (thousands
separators allowed: "1,280,000").
"""
import os
import re
import sys
from pathlib import Path

import pytest
from mpi_launch import MPIEXEC, REPO, run_command, run_mpi

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"  # 1,234.5 too


def mpi(ranks):
    """The parameter "under real mpiexec with `ranks` ranks" of a test that also runs the
    script as threads: a `deep` test (.ci/run's `pytest -m deep`), as the everyday suite
    runs the same script as threads and real MPI in tests/parallel."""
    return pytest.param({"mpi_ranks": ranks}, marks=pytest.mark.deep)


def run_script(path, *args, timeout=120, mpi_ranks=None, threads=None):
    script = Path(path) if Path(path).is_absolute() else REPO / path
    arguments = [str(a) for a in args] + (["--threads", str(threads)] if threads is not None else [])
    if mpi_ranks is not None:
        if MPIEXEC is None:
            pytest.skip(f"!!! NO mpiexec FOUND next to {sys.executable} or on PATH: "
                        f"{script.name} did NOT run under MPI !!!")
        return run_mpi(mpi_ranks, [script, *arguments], timeout=timeout).stdout
    return _run_python([sys.executable, str(script), *arguments], timeout)


def _run_python(command, timeout):
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # as run_mpi does: tests share the cores with other tests
    return run_command(command, timeout, env=env, cwd=REPO).stdout


def numbers_after(label, text):
    """Every number that follows `label` (then optional spaces, ':' or '=') in `text`, in order."""
    pattern = re.escape(label) + r"\s*[:=]?\s*(" + _NUMBER + ")"
    return [float(m.replace(",", "")) for m in re.findall(pattern, text)]


def number_after(label, text):
    """The single number after `label` in `text`; fails the test if the label is missing or repeated."""
    found = numbers_after(label, text)
    if len(found) != 1:
        pytest.fail(f"expected exactly one number after {label!r}, found {found} in:\n{text}")
    return found[0]
