"""The threads backend of parallel.comm against numpy references, plus its errors and failure handling."""
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import allreduce_algorithms, array_layouts, comm_dtypes, comm_shapes, group_sizes, reduce_ops, seeds

import parallel
from parallel.comm import CommAborted, DeadlockError

REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}
TIMEOUT = 20  # seconds: a bound on every run_threads call, so a bug fails instead of hanging


def rank_inputs(seed, size, shape, dtype):
    """One array per rank, of small integers: every reduction order then gives exactly the same result."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 51, size=shape).astype(dtype) for _ in range(size)]


def with_layout(arr, layout):
    """An array equal to `arr`, laid out in memory as named ("C" is contiguous, the others are not)."""
    if layout == "C":
        return arr.copy()
    if layout == "fortran":
        return np.asfortranarray(arr)
    if layout == "reversed":
        return np.flip(np.flip(arr).copy())
    base = np.zeros((2 * arr.shape[0],) + arr.shape[1:], arr.dtype)  # "strided": every other row
    base[::2] = arr
    return base[::2]


def run(size, fn):
    return parallel.run_threads(size, fn, timeout=TIMEOUT)


# --- collectives against numpy ------------------------------------------------------

@given(size=group_sizes, shape=comm_shapes(min_side=0), dtype=comm_dtypes, op=reduce_ops,
       algorithm=allreduce_algorithms, layout=array_layouts, seed=seeds)
def test_all_reduce_equals_numpy_reduction(size, shape, dtype, op, algorithm, layout, seed):
    inputs = rank_inputs(seed, size, shape, dtype)
    expected = REDUCE[op].reduce(np.stack(inputs), axis=0).astype(dtype)

    def rank_fn():
        group = parallel.world()
        arr = with_layout(inputs[group.rank], layout)
        returned = group.all_reduce(arr, op=op, algorithm=algorithm)
        return returned is arr, arr.copy()
    for same_object, result in run(size, rank_fn):
        assert same_object
        assert result.dtype == dtype
        np.testing.assert_array_equal(result, expected)


@given(size=group_sizes, n=st.integers(0, 40), seed=seeds)
def test_ring_all_reduce_equals_builtin_on_random_floats(size, n, seed):
    inputs = [np.random.default_rng(seed + r).standard_normal(n) for r in range(size)]

    def rank_fn():
        group = parallel.world()
        ring, builtin = inputs[group.rank].copy(), inputs[group.rank].copy()
        group.all_reduce(ring, algorithm="ring")
        group.all_reduce(builtin)
        return ring, builtin
    scale = np.abs(np.stack(inputs)).sum(axis=0)
    for ring, builtin in run(size, rank_fn):
        np.testing.assert_allclose(ring, builtin, rtol=1e-9, atol=1e-15 * scale.max(initial=1.0))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_the_ring_takes_2_n_minus_1_steps_on_every_rank(size, monkeypatch):
    """The ring's cost (chapter 10's 2(n − 1) messages per rank): one step more, say a reduce-scatter of n
    steps whose extra sum the all-gather overwrites, gives the right values and costs a message more."""
    from parallel.comm import ring
    steps, exchange = [0] * size, ring.exchange

    def counted(group, *args):
        steps[group.rank] += 1  # each thread writes only its own rank's entry
        return exchange(group, *args)

    monkeypatch.setattr(ring, "exchange", counted)
    run(size, lambda: parallel.world().all_reduce(np.arange(10.0), algorithm="ring"))
    assert steps == [2 * (size - 1)] * size


@given(size=group_sizes, shape=comm_shapes(), dtype=comm_dtypes, layout=array_layouts, seed=seeds, data=st.data())
def test_all_gather_concatenates_in_rank_order(size, shape, dtype, layout, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    inputs = rank_inputs(seed, size, shape, dtype)

    def rank_fn():
        group = parallel.world()
        return group.all_gather(with_layout(inputs[group.rank], layout), axis=axis)
    for result in run(size, rank_fn):
        assert result.dtype == dtype
        np.testing.assert_array_equal(result, np.concatenate(inputs, axis=axis))


@given(size=group_sizes, shape=comm_shapes(), dtype=comm_dtypes, op=reduce_ops, layout=array_layouts,
       seed=seeds, data=st.data())
def test_reduce_scatter_gives_each_rank_its_chunk_of_the_reduction(size, shape, dtype, op, layout, seed, data):
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    shape = shape[:axis] + (shape[axis] * size,) + shape[axis + 1:]
    inputs = rank_inputs(seed, size, shape, dtype)
    chunks = np.split(REDUCE[op].reduce(np.stack(inputs), axis=0), size, axis=axis)

    def rank_fn():
        group = parallel.world()
        return group.reduce_scatter(with_layout(inputs[group.rank], layout), axis=axis, op=op)
    for rank, result in enumerate(run(size, rank_fn)):
        assert result.dtype == dtype
        np.testing.assert_array_equal(result, chunks[rank])


@given(size=group_sizes, shape=comm_shapes(min_side=0), dtype=comm_dtypes, layout=array_layouts, seed=seeds,
       data=st.data())
def test_broadcast_copies_the_root_buffer_everywhere(size, shape, dtype, layout, seed, data):
    root = data.draw(st.integers(0, size - 1), label="root")
    inputs = rank_inputs(seed, size, shape, dtype)

    def rank_fn():
        group = parallel.world()
        arr = with_layout(inputs[group.rank], layout)
        assert group.broadcast(arr, root=root) is arr
        return arr
    for result in run(size, rank_fn):
        np.testing.assert_array_equal(result, inputs[root])


@given(size=group_sizes, layout=array_layouts, seed=seeds)
def test_async_all_reduce_completes_on_wait_in_any_order(size, layout, seed):
    first, second = rank_inputs(seed, size, (3, 4), np.float64), rank_inputs(seed + 1, size, (5,), np.int64)

    def rank_fn():
        group = parallel.world()
        a, b = with_layout(first[group.rank], layout), second[group.rank].copy()
        pending_a = group.all_reduce(a, async_op=True)
        pending_b = group.all_reduce(b, op="max", async_op=True)
        blocking = group.all_reduce(np.array([1.0]))  # another collective in between
        assert pending_b.wait() is b
        assert pending_a.wait() is a
        return a, b, blocking
    for a, b, blocking in run(size, rank_fn):
        np.testing.assert_array_equal(a, np.sum(first, axis=0))
        np.testing.assert_array_equal(b, np.max(second, axis=0))
        np.testing.assert_array_equal(blocking, [size])


# --- point to point -----------------------------------------------------------------

def message(rank, tag, copy):
    """A message whose shape and values say who sent it, with which tag, and which copy it is."""
    return np.full((tag + 1, 2), 100 * rank + 10 * tag + copy, dtype=np.float64)


@given(size=st.integers(2, 8), order=st.permutations(range(4)))
def test_blocking_recv_matches_tags_out_of_order_and_same_tag_in_order(size, order):
    def rank_fn():
        group = parallel.world()
        right, left = (group.rank + 1) % group.size, (group.rank - 1) % group.size
        sends = [group.isend(message(group.rank, tag, copy), right, tag=tag) for tag in range(4) for copy in (0, 1)]
        received = {}
        for tag in order:
            for copy in (0, 1):
                received[tag, copy] = group.recv(np.empty((tag + 1, 2)), left, tag=tag)
        for request in sends:
            request.wait()
        return left, received
    for left, received in run(size, rank_fn):
        for (tag, copy), arr in received.items():
            np.testing.assert_array_equal(arr, message(left, tag, copy))


@given(size=st.integers(2, 8), order=st.permutations(range(4)), layout=array_layouts)
def test_irecv_posted_before_the_sends_and_waited_in_any_order(size, order, layout):
    def rank_fn():
        group = parallel.world()
        right, left = (group.rank + 1) % group.size, (group.rank - 1) % group.size
        buffers = {tag: with_layout(np.zeros((tag + 1, 2)), layout) for tag in range(4)}
        receives = {tag: group.irecv(buffers[tag], left, tag=tag) for tag in order}
        sends = [group.isend(with_layout(message(group.rank, tag, 0), layout), right, tag=tag) for tag in range(4)]
        results = {tag: receives[tag].wait() for tag in reversed(order)}
        for request in sends:
            request.wait()
        assert all(results[tag] is buffers[tag] for tag in range(4))
        return left, buffers
    for left, buffers in run(size, rank_fn):
        for tag, arr in buffers.items():
            np.testing.assert_array_equal(arr, message(left, tag, 0))


def test_blocking_sends_to_each_other_are_reported_as_a_deadlock():
    """send is synchronous (like MPI_Ssend): two ranks sending first would hang under MPI for big messages."""
    def rank_fn():
        group = parallel.world()
        group.send(np.zeros(4), dst=1 - group.rank)
        group.recv(np.zeros(4), src=1 - group.rank)
    with pytest.raises(DeadlockError, match=r"rank 0 in send\(dst=1, tag=0\); rank 1 in send\(dst=0, tag=0\)"):
        run(2, rank_fn)


# --- groups ------------------------------------------------------------------------------

@given(size=group_sizes, data=st.data())
def test_split_orders_members_by_key_and_sub_groups_run_concurrently(size, data):
    colors = data.draw(st.lists(st.integers(0, 2), min_size=size, max_size=size), label="colors")
    keys = data.draw(st.lists(st.integers(0, 3), min_size=size, max_size=size), label="keys")

    def rank_fn():
        group = parallel.world()
        sub = group.split(colors[group.rank], keys[group.rank])
        members = sub.all_gather(np.array([group.rank]))
        total = sub.all_reduce(np.array([float(group.rank)]))
        return sub.rank, sub.size, list(members), total[0], sub.stats(), group.stats()
    for rank, (sub_rank, sub_size, members, total, sub_stats, stats) in enumerate(run(size, rank_fn)):
        expected = [r for _, r in sorted((keys[r], r) for r in range(size) if colors[r] == colors[rank])]
        assert (sub_rank, sub_size, members, total) == (expected.index(rank), len(expected), expected, sum(expected))
        assert set(sub_stats) == {"all_gather", "all_reduce"}
        assert set(stats) == {"split"}


def test_world_outside_run_threads_is_one_rank():
    group = parallel.world()
    assert (group.rank, group.size, group.backend) == (0, 1, "threads")
    assert parallel.world() is group
    arr = np.arange(4.0)
    np.testing.assert_array_equal(group.all_reduce(arr, algorithm="ring"), np.arange(4.0))
    np.testing.assert_array_equal(group.all_gather(arr), arr)
    assert parallel.run_threads(3, lambda: parallel.world().rank, timeout=TIMEOUT) == [0, 1, 2]


def test_all_reduce_on_one_rank_starts_no_collective_and_still_counts(monkeypatch):
    """The reduction of one rank's buffer is the buffer: the call hands it back (or a finished
    request) without a collective, and the accounting still sees the call (with 0 bytes sent)."""
    group = parallel.world()
    monkeypatch.setattr(group, "_iall_reduce", lambda *args: pytest.fail("one rank started a collective"))
    group.reset_stats()
    arr = np.arange(4.0)
    assert group.all_reduce(arr, op="max") is arr and group.all_reduce(arr, async_op=True).wait() is arr
    np.testing.assert_array_equal(arr, np.arange(4.0))
    assert group.stats()["all_reduce"] == {"calls": 2, "elements": 8, "bytes": 0}


# --- accounting ---------------------------------------------------------------------------

def test_stats_follow_the_documented_cost_model():
    n, nbytes = 4, 80  # ten float64

    def rank_fn():
        group = parallel.world()
        group.all_reduce(np.zeros(10))
        group.all_reduce(np.zeros(10), algorithm="ring")
        group.all_reduce(np.zeros(10), async_op=True).wait()
        group.all_gather(np.zeros(10))
        group.reduce_scatter(np.zeros(8))
        group.broadcast(np.zeros(10), root=2)
        group.barrier()
        right, left = (group.rank + 1) % n, (group.rank - 1) % n
        sending = group.isend(np.zeros(10), right)
        group.recv(np.zeros(10), left)
        sending.wait()
        stats = group.stats()
        group.reset_stats()
        return stats, group.stats()
    expected = {
        "all_reduce": {"calls": 3, "elements": 30, "bytes": 3 * (2 * (n - 1) * nbytes // n)},
        "all_gather": {"calls": 1, "elements": n * 10, "bytes": (n - 1) * nbytes},
        "reduce_scatter": {"calls": 1, "elements": 8, "bytes": (n - 1) * 64 // n},
        "broadcast": {"calls": 1, "elements": 10, "bytes": nbytes},
        "barrier": {"calls": 1, "elements": 0, "bytes": 0},
        "send": {"calls": 1, "elements": 10, "bytes": nbytes},
        "recv": {"calls": 1, "elements": 10, "bytes": nbytes},
    }
    for stats, after_reset in run(n, rank_fn):
        assert stats == expected  # the ring's internal messages are not counted as send/recv
        assert after_reset == {}


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, pattern", [
    (lambda g: g.all_reduce(np.zeros(3, bool)), TypeError, "dtype bool"),
    (lambda g: g.all_reduce(np.zeros(3, np.complex128)), TypeError, "dtype complex128"),
    (lambda g: g.broadcast([1.0, 2.0]), TypeError, "numpy array, got list"),
    (lambda g: g.all_reduce(np.zeros(3), op="mean"), ValueError, "op='mean'"),
    (lambda g: g.all_reduce(np.zeros(3), algorithm="tree"), ValueError, "algorithm='tree'"),
    (lambda g: g.all_reduce(np.zeros(3), algorithm="ring", async_op=True), ValueError, "async_op"),
    (lambda g: g.broadcast(np.zeros(3), root=2), ValueError, "root=2 is out of range for a group of size 2"),
    (lambda g: g.send(np.zeros(3), dst=-1), ValueError, "dst=-1 is out of range for a group of size 2"),
    (lambda g: g.recv(np.zeros(3), src=5), ValueError, "src=5 is out of range"),
    (lambda g: g.send(np.zeros(3), dst=1, tag=-3), ValueError, "tag=-3"),
    # the top tag is the ring all-reduce's own (comm/checks.py RING_TAG): a user's message must not match it
    (lambda g: g.send(np.zeros(3), dst=1, tag=32767), ValueError, r"tag=32767 must be an int in \[0, 32767\)"),
    (lambda g: g.reduce_scatter(np.zeros((3, 4))), ValueError, r"shape \(3, 4\) has 3 entries along axis 0, "
                                                                "not divisible by the group size 2"),
    (lambda g: g.all_gather(np.zeros((3, 4)), axis=2), ValueError, "axis=2 is out of range"),
    (lambda g: g.all_reduce(np.broadcast_to(np.zeros(3), (2, 3))), ValueError, r"shape \(2, 3\) is read-only"),
    (lambda g: g.split(color=-1), ValueError, "color=-1"),
])
def test_bad_arguments_raise_clear_errors_on_every_rank(call, error, pattern):
    def rank_fn():
        try:
            call(parallel.world())
        except error as exc:
            return str(exc)
    messages = run(2, rank_fn)
    assert all(m is not None for m in messages)
    for m in messages:
        assert re.search(pattern, m), m


@pytest.mark.parametrize("fn, pattern", [
    (lambda g: g.all_reduce(np.zeros(3, np.float64 if g.rank else np.float32)),
     r"all_reduce called with different arguments across ranks: rank 0: .*float32.*; rank 1: .*float64"),
    (lambda g: g.all_gather(np.zeros(2 + g.rank)),
     r"all_gather called with different arguments across ranks: rank 0: .*\(2,\).*; rank 1: .*\(3,\)"),
    (lambda g: g.broadcast(np.zeros(2), root=g.rank),
     r"broadcast called with different arguments across ranks: rank 0: .*'root': 0.*rank 1: .*'root': 1"),
    (lambda g: g.barrier() if g.rank else g.all_reduce(np.zeros(2)),
     r"collective mismatch in a group of size 2: rank 0 called all_reduce, rank 1 called barrier"),
])
def test_calls_that_disagree_across_ranks_raise_instead_of_mixing_data(fn, pattern):
    with pytest.raises(ValueError, match=pattern):
        run(2, lambda: fn(parallel.world()))


def test_recv_into_a_buffer_of_the_wrong_shape_and_dtype_names_both():
    def rank_fn():
        group = parallel.world()
        if group.rank == 0:
            group.isend(np.zeros(3), dst=1, tag=7)
        else:
            group.recv(np.zeros((4,), np.float32), src=0, tag=7)
    pattern = (r"recv: the message from rank 0 \(tag 7\) has shape \(3,\) and dtype float64, "
               r"but the receive buffer has shape \(4,\) and dtype float32")
    with pytest.raises(ValueError, match=pattern):
        run(2, rank_fn)


# --- failure on one rank: never a hang -------------------------------------------------------

def fail_on_last_rank_while_others_wait(wait):
    group = parallel.world()
    if group.rank == group.size - 1:
        time.sleep(0.05)  # let the others block first
        raise ValueError(f"rank {group.rank} failed on purpose")
    wait(group)


@pytest.mark.parametrize("size, wait", [
    (2, lambda g: g.recv(np.zeros(2), src=1)),
    (4, lambda g: g.all_reduce(np.zeros(2))),
    (4, lambda g: g.all_reduce(np.zeros(2), async_op=True).wait()),
    (3, lambda g: g.split(0).barrier()),
])
def test_an_exception_on_one_rank_releases_the_others_and_reaches_the_caller(size, wait):
    released = []  # the ranks whose wait ended in CommAborted (a rank still blocked at the timeout is missing)

    def waiting(group):
        try:
            wait(group)
        except CommAborted:
            released.append(group.rank)
            raise
    with pytest.raises(ValueError, match=f"rank {size - 1} failed on purpose") as info:
        parallel.run_threads(size, fail_on_last_rank_while_others_wait, waiting, timeout=TIMEOUT)
    assert info.value.__notes__ == [f"raised on rank {size - 1} of run_threads(world_size={size})"]
    assert sorted(released) == list(range(size - 1))


def test_the_waiting_ranks_see_comm_aborted():
    seen = []

    def rank_fn():
        try:
            fail_on_last_rank_while_others_wait(lambda g: g.all_reduce(np.zeros(1)))
        except CommAborted as exc:
            seen.append(str(exc))
            raise
    with pytest.raises(ValueError):
        run(3, rank_fn)
    assert sorted(seen) == [f"rank {r} stopped waiting in all_reduce (group of size 3): rank 2 failed"
                            for r in (0, 1)]


def test_run_threads_timeout_raises_instead_of_waiting_forever():
    release, finished = threading.Event(), []

    def rank_fn():  # rank 1 runs until the test releases it (or 60 s pass, if run_threads waited for it)
        if parallel.world().rank == 1:
            release.wait(60)
        finished.append(parallel.world().rank)
    with pytest.raises(TimeoutError, match=r"ranks \[1\] still running after 0.2 s"):
        parallel.run_threads(2, rank_fn, timeout=0.2)
    assert finished == [0]  # run_threads returned while rank 1 was still running
    release.set()


def test_ranks_as_threads_run_blas_on_one_thread_each_and_the_count_comes_back():
    """Like one BLAS thread per mpiexec rank: while 2 ranks run as threads BLAS has one thread;
    a 1-rank run keeps the count; after either, the count is what it was."""
    from minitensor import kernel_threads
    set_threads = kernel_threads._openblas("set")
    if set_threads is None:
        pytest.skip("!!! numpy's BLAS is not OpenBLAS: its thread count cannot be set, nothing to check !!!")
    before = kernel_threads.blas_threads()
    try:
        set_threads(2)
        assert parallel.run_threads(2, kernel_threads.blas_threads) == [1, 1]
        assert kernel_threads.blas_threads() == 2
        assert parallel.run_threads(1, kernel_threads.blas_threads) == [2]
        with pytest.raises(ValueError, match="boom"):
            parallel.run_threads(2, lambda: (_ for _ in ()).throw(ValueError("boom")))
        assert kernel_threads.blas_threads() == 2                      # restored after a failed run too
    finally:
        set_threads(before)
