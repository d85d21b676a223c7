"""`python -m parallel.train`: train a small GPT under any dp × tp × pp layout.

    cli.py     the flags, their checks, the launch (one process, --threads N, or mpiexec)
    task.py    what it learns: the built-in addition task or char-level text (--data)
    loop.py    one rank's job: build the HybridGPT, train, evaluate
    check.py   --check: the single-device model beside it on rank 0
    report.py  start-up summary, progress lines, communication per step, Chrome trace
"""
from .cli import build_parser, main

__all__ = ["build_parser", "main"]
