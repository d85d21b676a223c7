"""Under mpiexec: every Group operation on real ranks against a numpy reference each rank computes.

Every rank builds every rank's input from the same seeds, so it knows the answer.
Prints "rank R ok" at the end; any failed check raises, which aborts the job.
"""
import itertools
import sys

import numpy as np

import parallel

REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}
DTYPES = (np.float32, np.float64, np.int32, np.int64)


def inputs(seed, shape, dtype, n):
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 51, size=shape).astype(dtype) for _ in range(n)]


def strided(arr):
    """A non-contiguous view equal to arr."""
    base = np.zeros((2 * arr.shape[0],) + arr.shape[1:], arr.dtype)
    base[::2] = arr
    return base[::2]


def check_collectives(group):
    n, rank = group.size, group.rank
    for seed, (dtype, shape, op) in enumerate(itertools.product(DTYPES, [(0,), (1,), (7,), (3, 5)], REDUCE)):
        data = inputs(seed, shape, dtype, n)
        expected = REDUCE[op].reduce(np.stack(data), axis=0)
        for algorithm in ("builtin", "ring"):
            arr = strided(data[rank])
            assert group.all_reduce(arr, op=op, algorithm=algorithm) is arr
            np.testing.assert_array_equal(arr, expected, err_msg=f"{algorithm} {op} {dtype} {shape}")
        arr = data[rank].copy()
        group.all_reduce(arr, op=op, async_op=True).wait()
        np.testing.assert_array_equal(arr, expected)
        if len(shape) == 2:
            for axis in (0, 1):
                np.testing.assert_array_equal(group.all_gather(strided(data[rank]), axis=axis),
                                              np.concatenate(data, axis=axis))
                wide = inputs(seed, shape[:axis] + (n * shape[axis],) + shape[axis + 1:], dtype, n)
                np.testing.assert_array_equal(group.reduce_scatter(wide[rank], axis=axis, op=op),
                                              np.split(REDUCE[op].reduce(np.stack(wide)), n, axis=axis)[rank])
            for root in range(n):
                arr = strided(data[rank])
                group.broadcast(arr, root=root)
                np.testing.assert_array_equal(arr, data[root])

    floats = [np.random.default_rng(100 + r).standard_normal(1001) for r in range(n)]
    ring, builtin = floats[rank].copy(), floats[rank].copy()
    group.all_reduce(ring, algorithm="ring")
    group.all_reduce(builtin)
    np.testing.assert_allclose(ring, builtin, rtol=1e-9, atol=1e-12)


def check_point_to_point(group):
    n, rank = group.size, group.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    sends = [group.isend(np.full((tag + 1, 2), 10 * rank + tag), right, tag=tag) for tag in range(4)]
    for tag in (2, 0, 3, 1):  # out of order
        received = group.recv(np.empty((tag + 1, 2), np.int64), left, tag=tag)
        np.testing.assert_array_equal(received, np.full((tag + 1, 2), 10 * left + tag))
    for request in sends:
        request.wait()
    buffers = [np.zeros(5) for _ in range(3)]
    receives = [group.irecv(b, left, tag=9) for b in buffers]
    for k in range(3):  # same tag: received in the order sent
        group.send(np.full(5, 100.0 * rank + k), right, tag=9)
    for k, request in reversed(list(enumerate(receives))):
        np.testing.assert_array_equal(request.wait(), np.full(5, 100.0 * left + k))


def check_split_and_mesh(group):
    n, rank = group.size, group.rank
    sub = group.split(color=rank % 2, key=-rank % n)  # reversed order inside each color
    members = sorted((r for r in range(n) if r % 2 == rank % 2), key=lambda r: -r % n)
    assert (sub.rank, sub.size) == (members.index(rank), len(members))
    np.testing.assert_array_equal(sub.all_gather(np.array([rank])), members)
    for dp, tp, pp in [(d, t, n // (d * t)) for d in (1, 2, 4) for t in (1, 2, 4) if n % (d * t) == 0]:
        mesh = parallel.Mesh(dp=dp, tp=tp, pp=pp)
        d, t, p, _ = mesh.coords
        assert rank == mesh.rank_of(d, t, p)
        np.testing.assert_array_equal(mesh.tp_group.all_gather(np.array([rank])),
                                      [mesh.rank_of(d, i, p) for i in range(tp)])
        np.testing.assert_array_equal(mesh.dp_group.all_gather(np.array([rank])),
                                      [mesh.rank_of(i, t, p) for i in range(dp)])
        np.testing.assert_array_equal(mesh.pp_group.all_gather(np.array([rank])),
                                      [mesh.rank_of(d, t, i) for i in range(pp)])


def check_stats(group):
    n = group.size
    group.reset_stats()
    group.all_reduce(np.zeros(10), algorithm="ring")
    group.all_gather(np.zeros(10))
    assert group.stats() == {"all_reduce": {"calls": 1, "elements": 10, "bytes": 2 * (n - 1) * 80 // n},
                             "all_gather": {"calls": 1, "elements": 10 * n, "bytes": (n - 1) * 80}}, group.stats()


def check_local_errors(group):
    for call, pattern in [(lambda: group.broadcast(np.zeros(2), root=group.size), f"root={group.size} is out"),
                          (lambda: group.send(np.zeros(2), dst=group.size), f"dst={group.size} is out"),
                          (lambda: group.all_reduce(np.zeros(2, bool)), "dtype bool")]:
        try:
            call()
        except (ValueError, TypeError) as exc:
            assert pattern in str(exc), str(exc)
        else:
            raise AssertionError(f"no error for {pattern}")


group = parallel.world()
assert group.backend == "mpi"
if group.rank == 0:
    print(parallel.launch.launch_report(group))
check_collectives(group)
check_point_to_point(group)
check_split_and_mesh(group)
check_stats(group)
check_local_errors(group)
group.barrier()
sys.stdout.write(f"rank {group.rank} ok\n")  # one write: lines of ranks do not interleave
sys.stdout.flush()
