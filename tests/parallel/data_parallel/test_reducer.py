"""The gradient reducer: flat buckets (pack, start, wait, unpack) over a real threads group."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from mpi_scripts.dp_common import tiny_net
from strategies import seeds

import minitensor as mt
import parallel
from minitensor import nn
from parallel import run_threads
from parallel.data_parallel.reducer import Bucket, Reducer, assign_buckets


def params_of(shapes, rng, grads=True):
    out = []
    for shape in shapes:
        p = nn.Parameter(rng.standard_normal(shape))
        p.grad = rng.standard_normal(shape) if grads else None
        out.append(p)
    return out


def test_bucket_packs_end_to_end_with_zero_padding_and_unpacks_in_place():
    a, b = nn.Parameter(np.zeros((2, 3))), nn.Parameter(np.zeros(1))
    a.grad, b.grad = np.arange(6.0).reshape(2, 3), None
    bucket = Bucket([a, b], length=9)
    np.testing.assert_array_equal(bucket.pack(), [0, 1, 2, 3, 4, 5, 0, 0, 0])  # no grad: zeros; padding: zeros
    grad_before = a.grad
    bucket.buffer[:7] = np.arange(7.0) * 2
    bucket.unpack(divisor=2)
    assert a.grad is grad_before  # written in place
    np.testing.assert_array_equal(a.grad, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(b.grad, [6.0])
    b.grad = None  # packed into a buffer that holds something else (ZeRO-1 packs the values in between): zeros
    bucket.buffer[:7] = 7.0
    np.testing.assert_array_equal(bucket.pack()[:7], [0, 1, 2, 3, 4, 5, 0])


def test_bucket_values_round_trip():
    rng = np.random.default_rng(0)
    ps = params_of([(2, 2), (3,)], rng)
    bucket = Bucket(ps, length=8)
    flat = bucket.pack_values().copy()
    np.testing.assert_array_equal(flat[:7], np.concatenate([ps[0].data.reshape(-1), ps[1].data]))
    bucket.unpack_values(flat * 3)
    np.testing.assert_array_equal(ps[1].data, flat[4:7] * 3)


def test_buckets_hold_reverse_order_within_the_size_bound():
    mt.manual_seed(0)
    trainable = [p for p in tiny_net().parameters() if p.requires_grad]
    bound = 600  # bytes: between the smallest (64 B) and the largest (704 B) float64 parameter
    buckets = assign_buckets(trainable[::-1], bound)
    assert [p for b in buckets for p in b] == trainable[::-1]
    assert all(sum(p.data.nbytes for p in b) <= bound or len(b) == 1 for b in buckets)
    # Greedy: no bucket could have taken the next bucket's first parameter.
    assert all(sum(p.data.nbytes for p in b) + nxt[0].data.nbytes > bound for b, nxt in zip(buckets, buckets[1:]))


def test_a_new_bucket_starts_where_the_dtype_changes():
    params = [nn.Parameter(np.zeros(2, dtype)) for dtype in (np.float32, np.float32, np.float64, np.float32)]
    assert [len(b) for b in assign_buckets(params, 1 << 20)] == [2, 1, 1]


@given(n=st.integers(1, 4), shapes=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4)), min_size=1, max_size=5),
       bucket_bytes=st.sampled_from([1, 64, 1 << 20]), average=st.booleans(), seed=seeds)
def test_reducer_sums_or_averages_every_gradient_over_the_group(n, shapes, bucket_bytes, average, seed):
    grads = [[np.random.default_rng([seed, r, i]).standard_normal(s) for i, s in enumerate(shapes)]
             for r in range(n)]

    def rank_fn():
        group = parallel.world()
        ps = [nn.Parameter(np.zeros(s)) for s in shapes]
        for p, g in zip(ps, grads[group.rank]):
            p.grad = g.copy()
        reducer = Reducer(ps, group, bucket_mb=bucket_bytes / 2**20, divisor=None if average else 1)
        reducer.start_next()  # one bucket early, as DataParallel does from its hooks
        reducer.finish()
        assert reducer.started == 0  # ready for the next round
        return [p.grad for p in ps], group.stats()["all_reduce"]["calls"], len(reducer.buckets)

    for got, calls, buckets in run_threads(n, rank_fn):
        assert calls == buckets  # one collective per bucket, not per parameter
        for i, g in enumerate(got):
            want = sum(grads[r][i] for r in range(n)) / (n if average else 1)
            np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)


def test_reducer_of_no_parameters_does_nothing():
    def rank_fn():
        reducer = Reducer([], parallel.world())
        reducer.finish()
        return parallel.world().stats()
    assert run_threads(2, rank_fn) == [{}, {}]


def test_reducer_counts_a_missing_gradient_as_zeros_even_after_a_round_that_had_one():
    def rank_fn():
        group = parallel.world()
        p = nn.Parameter(np.zeros(3))
        reducer = Reducer([p], group)
        p.grad = np.full(3, 4.0)
        reducer.finish()
        held = [b.buffer for b in reducer.buckets]  # dropped: no flat copy of the gradients between rounds
        p.grad = np.ones(3) if group.rank == 0 else None
        reducer.finish()
        return p.grad, held
    for g, held in run_threads(2, rank_fn):
        np.testing.assert_array_equal(g, np.full(3, 0.5))
        assert held == [None]


def test_a_bucket_packs_a_missing_gradient_as_zeros_over_last_packs_values():
    # a Bucket made by hand keeps its buffer from one pack to the next (the parameter server's does)
    p = nn.Parameter(np.zeros(3))
    bucket = Bucket([p])
    p.grad = np.full(3, 4.0)
    bucket.pack()
    p.grad = None
    np.testing.assert_array_equal(bucket.pack(), np.zeros(3))


@given(n=st.integers(1, 4), rounds=st.integers(1, 2), seed=seeds)
def test_sharded_reducer_keeps_this_ranks_chunk_of_the_mean_and_frees_the_gradients(n, rounds, seed):
    from parallel.data_parallel.reducer import ShardedReducer

    shapes = [(3, 2), (5,), (1,)]

    def rank_fn():
        group = parallel.world()
        rng = np.random.default_rng([seed, group.rank])
        ps = params_of(shapes, rng, grads=False)
        reducer = ShardedReducer(ps, group, bucket_mb=40 / 2**20)  # 40 bytes: buckets of 6, 5 and 1 float64s
        sent = []
        for _ in range(rounds):
            for p in ps:
                p.grad = rng.standard_normal(p.shape)
            sent.append(np.concatenate([p.grad.reshape(-1) for p in ps]))  # the buckets: ps in the order given
            reducer.finish()
            assert all(p.grad is None for p in ps) and reducer.in_flight_bytes() == 0
        return group.all_gather(np.sum(sent, axis=0)[None]), [b.grad_shard.copy() for b in reducer.buckets], \
            [[q.shape for q in b.params] for b in reducer.buckets]

    for rank, (everyone, shards, layout) in enumerate(run_threads(n, rank_fn, timeout=30)):
        mean = everyone.mean(axis=0)
        start = 0
        for shard, shapes_in_bucket in zip(shards, layout):
            numel = sum(int(np.prod(s)) for s in shapes_in_bucket)
            padded = np.concatenate([mean[start:start + numel], np.zeros(len(shard) * n - numel)])
            np.testing.assert_allclose(shard, padded[rank * len(shard):(rank + 1) * len(shard)], rtol=1e-12)
            start += numel
