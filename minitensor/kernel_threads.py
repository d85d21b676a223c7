"""Large elementwise kernels split over a small pool of threads.

numpy releases the GIL inside a ufunc, so two threads each running a ufunc over half of
an array use two cores; BLAS does this for matrix products, plain numpy does not. The
pool has as many threads as numpy's BLAS uses (the caller's thread counts as one), so
the setting that stops ranks sharing a machine from oversubscribing it (one BLAS thread
per rank under mpiexec: parallel.launch) also gives each rank one kernel thread: no pool.
Below `MIN_ELEMENTS` a kernel runs whole in the caller: waking a thread costs more than
it saves. Measured (2 cores, loaded by other jobs): the flat AdamW update of the medium
GPT (12.9 M parameters) 294 → 196 ms on two threads; of the small one (0.42 M) 0.82 →
1.09 ms, slower, hence the threshold.

Only kernels whose every output element depends on the same input elements whatever the
split (elementwise, or row by row) go through here, so the result is bitwise the same
with and without threads. Switch: speed.disabled("kernel_threads").
"""
import ctypes
import glob
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minitensor import speed

MIN_ELEMENTS = 1 << 20  # 1 Mi elements (4 MiB of float32) per call, at least


def blas_threads():
    """Threads numpy's OpenBLAS uses (asked from the library; else the env or the core count)."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(lib, symbol):
                return int(getattr(lib, symbol)())
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return os.cpu_count()


_pool = None  # (executor, threads) once made; (None, 1) when BLAS runs one thread


def pool():
    """(the shared executor or None, the number of threads a kernel is split over)."""
    global _pool
    if _pool is None:
        threads = blas_threads()
        _pool = (ThreadPoolExecutor(threads - 1, thread_name_prefix="minitensor-kernel") if threads > 1 else None,
                 threads)
    return _pool


def run_split(kernel, n, min_elements=MIN_ELEMENTS):
    """Call `kernel(lo, hi)` over [0, n): once, in this thread, when n is small (or the switch
    is off); else over one contiguous piece per pool thread and one here, waiting for all."""
    executor, pieces = pool()
    if executor is None or n < min_elements or not speed.enabled("kernel_threads"):
        kernel(0, n)
        return
    bounds = [n * i // pieces for i in range(pieces + 1)]
    futures = [executor.submit(kernel, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    try:
        kernel(bounds[0], bounds[1])
    finally:
        for future in futures:
            future.result()
