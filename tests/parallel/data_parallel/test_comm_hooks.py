"""Compression hooks of the gradient reducer against their exact references (threads backend).

PowerSGD at full rank and top-k at ratio 1 are plain data parallelism; PowerSGD on n
ranks is one process's PowerSGD on the mean gradient (it is linear in the gradient);
error feedback loses nothing; the counted bytes are each method's formula.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_scripts.compress_common import check_bytes, check_same_training, make_hook, reference, run_compressed
from mpi_scripts.dp_common import make_data
from strategies import seeds

import parallel
from minitensor import nn
from parallel import run_threads
from parallel.comm.threads import single_rank_group
from parallel.data_parallel.comm_hooks import PowerSGD, SignCompression, TopK
from parallel.data_parallel.comm_hooks import make_hook as parse_hook
from parallel.data_parallel.comm_hooks.powersgd import full_rank_query, orthogonalize
from parallel.data_parallel.comm_hooks.sign import pack_signs, unpack_signs
from parallel.data_parallel.reducer import Bucket

STEPS = 3
TIMEOUT = 60
BUCKETS = st.sampled_from([1e-6, 25])  # a bucket per parameter, or one for all


def train(n, name, options, seed, bucket_mb):
    data = make_data(seed, n, 1, 2, STEPS)
    runs = run_threads(n, lambda: run_compressed(parallel.world(), make_hook(name, **options), seed, data,
                                                 bucket_mb), timeout=TIMEOUT)
    return runs, reference(name, options, seed, data, bucket_mb)


@settings(max_examples=6, deadline=None)
@given(n=st.integers(2, 4), bucket_mb=BUCKETS, seed=seeds)
def test_powersgd_at_full_rank_is_data_parallelism(n, bucket_mb, seed):
    options = dict(rank=100, min_compression_rate=0)  # every matrix compressed, at rank min(m, k)
    runs, ref = train(n, "powersgd", options, seed, bucket_mb)
    for run in runs:
        check_same_training(run, ref)
        assert any("all_reduce" in s and s["all_reduce"]["calls"] > len(run["buckets"]) for s in run["stats"])


@settings(max_examples=6, deadline=None)
@given(n=st.integers(2, 4), rank=st.integers(1, 3), bucket_mb=BUCKETS, seed=seeds)
def test_powersgd_on_n_ranks_is_powersgd_of_the_mean_gradient(n, rank, bucket_mb, seed):
    options = dict(rank=rank)
    runs, ref = train(n, "powersgd", options, seed, bucket_mb)
    for run in runs:
        check_same_training(run, ref)
        check_bytes(run, make_hook("powersgd", **options), n)


@settings(max_examples=4, deadline=None)
@given(n=st.integers(2, 4), bucket_mb=BUCKETS, seed=seeds)
def test_topk_at_ratio_one_is_data_parallelism(n, bucket_mb, seed):
    runs, ref = train(n, "topk", dict(ratio=1.0), seed, bucket_mb)
    for run in runs:
        check_same_training(run, ref)


@pytest.mark.parametrize("name, options", [("topk", dict(ratio=0.1)), ("topk", dict(ratio=0.5)), ("sign", {}),
                                           ("powersgd", dict(rank=2, start_step=1))])
@pytest.mark.parametrize("n", [2, 3])
def test_counted_bytes_per_step_are_the_formula(name, options, n):
    data = make_data(5, n, 1, 2, STEPS)
    runs = run_threads(n, lambda: run_compressed(parallel.world(), make_hook(name, **options), 5, data, 0.001),
                       timeout=TIMEOUT)
    for run in runs:
        if name == "powersgd":  # start_step=1: the first step is a plain all-reduce of every element
            first = run["stats"][0]["all_reduce"]
            assert first["elements"] == sum(b.numel for b in run["buckets"])
            run["stats"] = run["stats"][1:]
        check_bytes(run, make_hook(name, **options), n)


def bucket_of(rng, shapes):
    params = [nn.Parameter(np.zeros(shape)) for shape in shapes]
    for p in params:
        p.grad = rng.standard_normal(p.shape)
    return Bucket(params)


SHAPES = [(6, 5), (7,), (4, 3, 2)]


@pytest.mark.parametrize("hook_class, options, exact", [
    (TopK, dict(ratio=0.3), True), (SignCompression, {}, False), (PowerSGD, dict(rank=1), False)])
def test_error_feedback_loses_nothing(hook_class, options, exact):
    """Each rank's gradient + old error == what it sent + its new error, where the ranks'
    `sent` add up to the bucket's result: exactly for top-k (disjoint supports), to
    rounding for sign and PowerSGD (a subtraction undone)."""
    n = 3

    def rank_fn():
        group = parallel.world()
        rng = np.random.default_rng([11, group.rank])
        hook = hook_class(**options)
        rounds = []
        for _ in range(3):
            bucket = bucket_of(rng, SHAPES)
            old = hook.feedback.errors.get(0, np.zeros(bucket.numel)).copy()
            gradient = bucket.pack().copy()
            result = hook(group, 0, bucket).wait().copy()
            new = hook.feedback.errors[0].copy()
            rounds.append((gradient, old, new, result))
        return rounds
    ranks = run_threads(n, rank_fn, timeout=TIMEOUT)
    for step in range(3):
        sent = [gradient + old - new for gradient, old, new, _ in (r[step] for r in ranks)]
        total = sent[0].copy()
        for other in sent[1:]:
            total += other
        for *_, result in (r[step] for r in ranks):
            if exact:
                np.testing.assert_array_equal(total, result)
            else:
                np.testing.assert_allclose(total, result, rtol=1e-12, atol=1e-12)
        assert any(np.abs(new).max() > 0 for _, _, new, _ in (r[step] for r in ranks))


def test_topk_sends_the_largest_entries_of_each_rank():
    def rank_fn():
        group = parallel.world()
        bucket = bucket_of(np.random.default_rng([3, group.rank]), [(10,)])
        gradient = bucket.pack().copy()
        return gradient, TopK(ratio=0.2)(group, 0, bucket).wait().copy()
    ranks = run_threads(2, rank_fn, timeout=TIMEOUT)
    expected = np.zeros(10)
    for gradient, _ in ranks:
        top = np.argsort(-np.abs(gradient))[:2]
        expected[top] += gradient[top]
    for _, result in ranks:
        np.testing.assert_array_equal(result, expected)


def test_sign_sends_scaled_signs_and_packs_64_per_word():
    values = np.array([-2.0, 0.0, 3.0, -1e-9] * 20)
    words = pack_signs(values)
    assert words.dtype == np.int64 and words.size == 2
    np.testing.assert_array_equal(unpack_signs(words, values.size), np.where(values >= 0, 1.0, -1.0))

    def rank_fn():
        group = parallel.world()
        bucket = bucket_of(np.random.default_rng([4, group.rank]), [(3, 2), (5,)])
        gradient = bucket.pack().copy()
        return gradient, SignCompression()(group, 0, bucket).wait().copy()
    ranks = run_threads(2, rank_fn, timeout=TIMEOUT)
    expected = np.zeros(11)
    for gradient, _ in ranks:
        for where in (slice(0, 6), slice(6, 11)):
            expected[where] += np.abs(gradient[where]).mean() * np.where(gradient[where] >= 0, 1.0, -1.0)
    for _, result in ranks:
        np.testing.assert_allclose(result, expected, rtol=1e-15)


def test_orthogonalize_gives_orthonormal_columns_spanning_the_same_space():
    p = np.random.default_rng(0).standard_normal((7, 3))
    q = orthogonalize(p.copy())
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(q @ (q.T @ p), p, atol=1e-12)
    p[:, 1] = 0  # a zero column stays zero (the docstring's promise), and the others stay orthonormal
    q = orthogonalize(p.copy())
    assert np.all(q[:, 1] == 0) and np.isfinite(q).all()
    np.testing.assert_allclose(q.T @ q, np.diag([1.0, 0.0, 1.0]), atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, dependent=st.integers(0, 3))
def test_a_warm_start_query_of_low_rank_is_completed_without_moving_its_span(seed, dependent):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((6, 4))
    q[:, 4 - dependent:] = q[:, :4 - dependent] @ rng.standard_normal((4 - dependent, dependent))  # rank 4 - dependent
    m = rng.standard_normal((5, 6))
    full = full_rank_query(q.copy(), np.random.default_rng(1))
    np.testing.assert_allclose(full.T @ full, np.eye(4), atol=1e-12)  # orthonormal, so of rank 4
    kept = orthogonalize(q[:, :4 - dependent].copy())  # the independent columns' span is still in it
    np.testing.assert_allclose(full @ (full.T @ kept), kept, atol=1e-12)
    if dependent == 0:  # nothing to complete: span(M·Q), and so PowerSGD's P̂·P̂ᵀ·M, is unchanged
        p_hat, p_full = orthogonalize(m @ q), orthogonalize(m @ full)
        np.testing.assert_allclose(p_full @ (p_full.T @ m), p_hat @ (p_hat.T @ m), atol=1e-12)


def test_full_rank_powersgd_stays_exact_after_a_gradient_of_lower_rank():
    rng = np.random.default_rng(3)
    # m > k, so P̂ (6 × 5) must span M's columns. A gradient of exact zeros in one column block
    # (an input feature that was 0 in that batch) gives a warm-start Q with exactly zero rows.
    first = rng.standard_normal((6, 5))
    first[:, 2:] = 0.0
    grads = [first, rng.standard_normal((6, 5))]
    hook = PowerSGD(rank=5, min_compression_rate=0)
    p = nn.Parameter(np.zeros((6, 5)))
    for grad in grads:  # the second round warm-starts from the first's Q, of rank 1
        bucket = Bucket([p])
        bucket.buffer[...] = grad.reshape(-1)
        out = hook(single_rank_group(), 0, bucket).wait()
        np.testing.assert_allclose(out.reshape(6, 5), grad, atol=1e-12)


def test_powersgd_compresses_only_when_strictly_worth_it_as_pytorch_does():
    # PyTorch's _should_compress: (m + k)·r·min_compression_rate < m·k, strictly.
    hook = PowerSGD(rank=1)
    assert hook.matrix_shape((4, 4)) is None  # 16 = 2·(4 + 4)·1: no saving worth the work
    assert hook.matrix_shape((5, 4)) == (5, 4, 1)  # 20 > 2·(5 + 4)·1 = 18
    assert PowerSGD(rank=2).matrix_shape((8, 2, 4)) is None  # 8 × 8: 64 = 2·(8 + 8)·2
    assert PowerSGD(rank=1, min_compression_rate=0).matrix_shape((1, 1)) == (1, 1, 1)


@pytest.mark.parametrize("hook_class, options", [(PowerSGD, dict(rank=1)), (TopK, dict(ratio=0.3)),
                                                  (SignCompression, {})])
def test_a_hook_restored_from_its_state_continues_bitwise_alike(hook_class, options):
    def rank_fn():
        group = parallel.world()
        rng = np.random.default_rng([12, group.rank])
        grads = [rng.standard_normal((6, 5)) for _ in range(3)]

        def round_of(hook, grad):
            p = nn.Parameter(np.zeros((6, 5)))
            p.grad = grad
            bucket = Bucket([p])
            bucket.pack()
            return hook(group, 0, bucket).wait().copy()
        original = hook_class(**options)
        for grad in grads[:2]:
            round_of(original, grad)
        restored = hook_class(**options)
        restored.load_state_dict({k: v.copy() for k, v in original.state_dict().items()})
        return round_of(original, grads[2]), round_of(restored, grads[2]), original.state_dict()
    for continued, resumed, state in run_threads(2, rank_fn, timeout=TIMEOUT):
        np.testing.assert_array_equal(continued, resumed)
        assert any(k.startswith("error.") for k in state)


def test_compress_flag_parsing_names_the_bad_value():
    assert parse_hook("none") is None
    assert isinstance(parse_hook("powersgd:4"), PowerSGD) and parse_hook("powersgd:4").rank == 4
    assert parse_hook("topk:0.01").ratio == 0.01
    with pytest.raises(ValueError, match=r"--compress 'topk:2': TopK: ratio=2.0 must be in \(0, 1\]"):
        parse_hook("topk:2")
    with pytest.raises(ValueError, match=r"--compress 'zip' is not one of none, powersgd:R, topk:RATIO, sign"):
        parse_hook("zip")
