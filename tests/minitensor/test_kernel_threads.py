"""The kernel thread pool: the pieces of a split cover [0, n) exactly once, in order within
each piece, and the switch or a small n runs the kernel whole in the caller."""
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitensor import dtypes, kernel_threads, speed


def recorded_split(n, min_elements):
    calls, lock = [], threading.Lock()

    def kernel(lo, hi):
        with lock:
            calls.append((lo, hi, threading.current_thread().name))

    kernel_threads.run_split(kernel, n, min_elements)
    return calls


@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 10_000))
def test_the_pieces_cover_every_index_once(n):
    calls = recorded_split(n, min_elements=1)
    covered = sorted(i for lo, hi, _ in calls for i in range(lo, hi))
    assert covered == list(range(n))
    _, threads = kernel_threads.pool()
    assert len(calls) == (threads if n >= 1 else 1)  # n = 0 is below min_elements: one whole call


def test_small_kernels_and_the_switch_run_whole_in_the_caller():
    me = threading.current_thread().name
    assert recorded_split(100, min_elements=101) == [(0, 100, me)]
    with speed.disabled("kernel_threads"):
        assert recorded_split(10_000, min_elements=1) == [(0, 10_000, me)]


def gpt_gradients(dtype):
    import minitensor as mt
    from minitensor.models.gpt import GPT, GPTConfig
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=4, d_model=64), dtype=dtype)
    idx = np.random.default_rng(0).integers(0, 13, size=(4, 16))
    loss = model(idx, np.roll(idx, -1, axis=1))[1]
    loss.backward()
    return [loss.data] + [p.grad for p in model.parameters()]


def test_attention_on_one_blas_thread_is_bitwise_the_same_and_the_count_comes_back():
    threads = kernel_threads.blas_threads()
    for dtype in (np.float32, np.float64):
        fast = gpt_gradients(dtype)
        with speed.disabled("single_thread_small_gemms"):
            plain = gpt_gradients(dtype)
        for a, b in zip(fast, plain):
            np.testing.assert_array_equal(a, b)
    assert kernel_threads.blas_threads() == threads


@settings(max_examples=25, deadline=None)
@given(stack=st.integers(1, 5), heads=st.integers(1, 3), m=st.integers(1, 40), k=st.integers(1, 40),
       n=st.integers(1, 40), dtype=st.sampled_from([np.float32, np.float64, np.float16]))
def test_a_split_stack_of_products_is_bitwise_one_call(stack, heads, m, k, n, dtype):
    """Split over two threads (a pool forced here, whatever this machine's BLAS count), every
    product of the stack equals numpy's own stacked product bit for bit."""
    rng = np.random.default_rng([stack, heads, m, k, n])
    a = rng.standard_normal((stack, heads, m, k)).astype(dtype)
    b = rng.standard_normal((stack, heads, n, k)).astype(dtype).swapaxes(-1, -2)  # a transposed view, as kᵀ
    with forced_split():
        split = kernel_threads.stacked_matmul(a, b)
    with kernel_threads.one_blas_thread():
        whole = dtypes.matmul(a, b)
    assert split.dtype == whole.dtype and split.shape == whole.shape
    np.testing.assert_array_equal(split, whole)


def forced_split():
    """Every stack split over a two-thread pool, however small: the pool and the threshold
    patched, whatever this machine's BLAS count."""
    executor = ThreadPoolExecutor(1)
    stack = contextlib.ExitStack()
    stack.callback(executor.shutdown)
    stack.enter_context(mock.patch.object(kernel_threads, "_pool", (executor, 2)))
    stack.enter_context(mock.patch.object(kernel_threads, "MIN_STACK_FLOPS", 0))
    return stack


@pytest.mark.parametrize("a_shape, b_shape, a_dtype", [
    ((3, 4, 5), (1, 5, 2), np.float64),   # b broadcasts over the stack
    ((6, 5), (5, 2), np.float64),         # no stack: a 2-D product
    ((6, 5), (5,), np.float64),           # a matrix times a vector
    ((4, 3, 5), (4, 5, 2), np.float32),   # mixed dtypes: numpy's result dtype, float64
])
def test_what_cannot_be_split_runs_as_one_call(a_shape, b_shape, a_dtype):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape).astype(a_dtype), rng.standard_normal(b_shape)
    with forced_split():
        got = kernel_threads.stacked_matmul(a, b)
    expected = np.matmul(a, b)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_the_pool_counts_blas_threads_even_when_first_asked_inside_one_blas_thread():
    """Attention may be the first to ask for the pool, inside one_blas_thread, where the
    library reports 1 thread: the pool must still count the threads that come back."""
    threads = kernel_threads.blas_threads()
    with mock.patch.object(kernel_threads, "_pool", None):
        with kernel_threads.one_blas_thread():
            executor, counted = kernel_threads.pool()
        if executor is not None:
            executor.shutdown()
    assert counted == threads
