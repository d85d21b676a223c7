"""Work split over a small pool of threads: large elementwise kernels, and stacks of
small matrix products.

numpy releases the GIL inside a ufunc, so two threads each running a ufunc over half of
an array use two cores; BLAS does this for matrix products, plain numpy does not. The
pool has as many threads as numpy's BLAS uses (the caller's thread counts as one), so
the setting that stops ranks sharing a machine from oversubscribing it (one BLAS thread
per rank under mpiexec: parallel.launch) also gives each rank one kernel thread: no pool.
Below `MIN_ELEMENTS` a kernel runs whole in the caller: waking a thread costs more than
it saves. Measured (2 cores, loaded by other jobs): the flat AdamW update of the medium
GPT (12.9 M parameters) 294 → 196 ms on two threads; of the small one (0.42 M) 0.82 →
1.09 ms, slower, hence the threshold.

Two kinds of work are served: the flat AdamW update (flat_params), and attention's stacks of
small matrix products (`stacked_matmul`: each product on one BLAS thread, the stack split
over the threads). GELU and the softmax forward went through here too until a quiet A/B of
the medium bench step showed no gain (pool on/off 650/658 ms and 743/703 ms, within the
±7% noise): they run whole, as plain numpy.

Only work whose every output element depends on the same input elements whatever the
split goes through here: elementwise kernels, and stacks of products each of which one
thread computes whole on one BLAS thread. So the result is bitwise the same with and
without threads. Switch: speed.disabled("kernel_threads").
"""
import contextlib
import ctypes
import functools
import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minitensor import dtypes, speed

MIN_ELEMENTS = 1 << 20  # 1 Mi elements (4 MiB of float32) per call, at least
MIN_STACK_FLOPS = 1 << 25  # a stack of products worth splitting: ~0.3 ms on one core. Measured (2 cores):
# 2^25 FLOPs (32, 4, 64, 32) @ (32, 4, 32, 64) 307 → 251-264 µs split; 2^24, the small bench GPT's
# (16, 4, 64, 32) stacks, 156 µs whole, 168-181 µs split: halves that short lose to the hand-off


@functools.cache
def _openblas(action):
    """numpy's OpenBLAS function `openblas_{action}_num_threads` (any symbol spelling), or None."""
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*")):
        lib = ctypes.CDLL(path)
        for symbol in (f"scipy_openblas_{action}_num_threads64_", f"openblas_{action}_num_threads64_",
                       f"openblas_{action}_num_threads"):
            if hasattr(lib, symbol):
                return getattr(lib, symbol)
    return None


def blas_threads():
    """Threads numpy's OpenBLAS uses (asked from the library; else the env or the core count)."""
    get = _openblas("get")
    if get is not None:
        return int(get())
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return os.cpu_count()


_single = {"users": 0, "threads": None, "lock": threading.Lock()}


@contextlib.contextmanager
def one_blas_thread():
    """Run the block's matrix products on one BLAS thread (then restore the count).

    For stacks of small products (attention's per-head q kᵀ and weights·v: 64 products of
    128×128×64 on the medium GPT) numpy calls BLAS once per matrix, and a multi-threaded
    BLAS wakes and joins its threads for each: on a machine shared with other jobs every
    join can wait a whole time slice. Measured on the loaded 2-core machine: one
    (8, 8, 128, 128) @ (8, 8, 128, 64) stack 797 ms on two BLAS threads, 2.3 ms on one
    (bitwise equal: the threads split the output, not the sums). Switch:
    speed.disabled("single_thread_small_gemms")."""
    with _blas_on_one_thread(speed.enabled("single_thread_small_gemms")):
        yield


@contextlib.contextmanager
def blas_thread_per_rank(ranks):
    """One BLAS thread while `ranks` > 1 ranks run as threads of this process, as mpiexec's ranks
    get one each (parallel.launch): two ranks each waking two BLAS threads on two cores wait on each
    other's spinning threads whenever the cores are busy. Measured (2 cores): chapter 13's
    `local_sgd.py --threads 2` with both cores busy with other work 30.8 s → 7.0 s; quiet 8.0–8.5 s
    → 7.7–10.6 s. Results are bitwise the same (BLAS threads split a product's output, not its sums)."""
    with _blas_on_one_thread(ranks > 1):
        yield


@contextlib.contextmanager
def blas_threads_of(threads):
    """Run the block on `threads` BLAS threads (then restore the count); None leaves the count alone,
    as does a BLAS whose count cannot be set (not numpy's OpenBLAS). The benchmarks run this way
    (minitensor.bench_cli: one thread unless asked), so a bench in one process and a rank under
    mpiexec time the same single-threaded products."""
    set_threads = _openblas("set") if threads else None
    if set_threads is None:
        yield
        return
    before = blas_threads()
    set_threads(threads)
    try:
        yield
    finally:
        set_threads(before)


@contextlib.contextmanager
def _blas_on_one_thread(wanted):
    """One BLAS thread in the block if `wanted` (and BLAS is numpy's OpenBLAS, whose count can be set)."""
    set_threads = _openblas("set") if wanted else None
    if set_threads is None:
        yield
        return
    with _single["lock"]:  # threads-backend ranks share the process: the first in sets, the last out restores
        if _single["users"] == 0:
            _single["threads"] = blas_threads()
            set_threads(1)
        _single["users"] += 1
    try:
        yield
    finally:
        with _single["lock"]:
            _single["users"] -= 1
            if _single["users"] == 0:
                set_threads(_single["threads"])


_pool = None  # (executor, threads) once made; (None, 1) when BLAS runs one thread


def pool():
    """(the shared executor or None, the number of threads a kernel is split over). Made
    once, under the lock: ranks run as threads may all ask first at the same moment."""
    global _pool
    if _pool is None:  # checked again under the lock; every later call reads it without one
        with _single["lock"]:
            if _pool is None:  # inside one_blas_thread the library says 1: count the threads it restores
                threads = _single["threads"] if _single["users"] else blas_threads()
                _pool = (ThreadPoolExecutor(threads - 1, thread_name_prefix="minitensor-kernel") if threads > 1
                         else None, threads)
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


def stacked_matmul(a, b):
    """a @ b for a stack of small products with the same leading shape (attention's heads:
    q kᵀ, weights·v and their gradients), each product on one BLAS thread.

    numpy calls BLAS once per product of the stack, so a multi-threaded BLAS would wake
    its threads for every small one (see one_blas_thread). Instead the stack is split
    along its first axis (the batch) over the kernel threads: numpy releases the GIL
    inside matmul, so each thread's single-threaded BLAS works on its own core. Every product is the same
    one-thread GEMM whichever thread runs it, so the result is bitwise that of one call.
    Measured (quiet 2-core machine): the medium GPT's stacks took 59 ms of a 645 ms step on
    one thread; one (8, 8, 128, 64) @ (8, 8, 64, 128) stack 2.18 ms whole, 1.20 ms split.
    One call on one BLAS thread instead: below MIN_STACK_FLOPS (the default job's 8-token
    attention), for stacks that broadcast or mix dtypes, or with the kernel_threads switch
    off. One call on BLAS's own threads where the count cannot be set (a BLAS other than
    OpenBLAS) or with single_thread_small_gemms off.
    """
    with one_blas_thread():
        if not splittable(a, b) or _openblas("set") is None or not speed.enabled("single_thread_small_gemms"):
            return dtypes.matmul(a, b)
        out = np.empty((*a.shape[:-1], b.shape[-1]), dtype=a.dtype)
        run_split(lambda lo, hi: dtypes.matmul(a[lo:hi], b[lo:hi], out=out[lo:hi]), len(a), min_elements=2)
        return out


def splittable(a, b):
    """True for a stack worth splitting: ≥ 3-D with the same leading shape and dtype, and at
    least MIN_STACK_FLOPS (2·M·K·N summed over the stack's products)."""
    return (a.ndim >= 3 and a.shape[:-2] == b.shape[:-2] and a.dtype == b.dtype
            and 2 * a.size * b.shape[-1] >= MIN_STACK_FLOPS)
