"""Benchmarks: `python -m parallel.bench NAME [args...]` runs `parallel.bench.NAME.main(argv)`.

A benchmark is any module in this folder with a `main(argv)`; the dispatcher
lists them by scanning the folder, so adding one needs no registration.
"""
