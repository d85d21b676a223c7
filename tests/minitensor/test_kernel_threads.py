"""The kernel thread pool: the pieces of a split cover [0, n) exactly once, in order within
each piece, and the switch or a small n runs the kernel whole in the caller."""
import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minitensor import kernel_threads, speed


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
