"""parallel.comm.link: a simulated network changes time, never results.

Time is only ever bounded from below ("at least the modelled time"): a loaded machine
makes everything slower, never faster.
"""
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import link_figures, seeds

import parallel
from parallel.comm.link import LINKS, Link, LinkGroup, parse_link, with_link
from parallel.train.cli import main as train_main

TIMEOUT = 60


def run(size, fn):
    return parallel.run_threads(size, fn, timeout=TIMEOUT)


def every_operation(group, seed):
    """Results of each kind of operation on rank-specific data (float64 sums in rank order: exact on threads)."""
    rng = np.random.default_rng([seed, group.rank])
    n, rank = group.size, group.rank
    x = rng.standard_normal(12)
    out = {"all_reduce": group.all_reduce(x.copy()),
           "async": group.all_reduce(x.copy() * 2, async_op=True).wait(),
           "ring": group.all_reduce(x.copy(), algorithm="ring"),
           "all_gather": group.all_gather(x[:3]),
           "reduce_scatter": group.reduce_scatter(np.arange(4.0 * n) * (rank + 1)),
           "broadcast": group.broadcast(x.copy(), root=n - 1),
           "all_to_all": group.all_to_all(np.arange(6.0 * n).reshape(2 * n, 3) * (rank + 1))}
    if n > 1:
        buf = np.empty(5)
        if rank == 0:
            group.send(x[:5], 1, tag=3)
        elif rank == 1:
            out["recv"] = group.recv(buf, 0, tag=3)
    sub = group.split(rank % 2)
    out["split_all_reduce"] = sub.all_reduce(x.copy())
    return out


@settings(max_examples=8, deadline=None)
@given(size=st.integers(1, 4), figures=link_figures, seed=seeds)
def test_a_link_changes_no_result_bitwise(size, figures, seed):
    alpha, beta = figures
    plain = run(size, lambda: every_operation(parallel.world(), seed))
    linked = run(size, lambda: every_operation(LinkGroup(parallel.world(), Link("test", alpha, beta)), seed))
    for mine, theirs in zip(plain, linked):
        assert mine.keys() == theirs.keys()
        for kind in mine:
            np.testing.assert_array_equal(mine[kind], theirs[kind], err_msg=kind)


def test_modelled_seconds_are_the_alpha_beta_formulas():
    alpha, beta, n, count = 1e-4, 1e-8, 4, 1000  # 1000 float64: N = 8000 bytes

    def rank_fn():
        group = LinkGroup(parallel.world(), Link("test", alpha, beta))
        group.all_reduce(np.ones(count))
        group.all_gather(np.ones(count // n))
        group.reduce_scatter(np.ones(count))
        if group.rank == 0:
            group.send(np.ones(count), 1)
        elif group.rank == 1:
            group.recv(np.empty(count), 0)
        return group.stats()
    stats = run(n, rank_fn)
    N = 8 * count
    assert stats[0]["all_reduce"]["modelled_s"] == pytest.approx(2 * (n - 1) * (alpha + N / n * beta), rel=1e-12)
    assert stats[0]["all_gather"]["modelled_s"] == pytest.approx((n - 1) * (alpha + N / n * beta), rel=1e-12)
    assert stats[0]["reduce_scatter"]["modelled_s"] == pytest.approx((n - 1) * (alpha + N / n * beta), rel=1e-12)
    assert stats[0]["send"]["modelled_s"] == pytest.approx(alpha + N * beta, rel=1e-12)
    assert stats[1]["recv"]["modelled_s"] == pytest.approx(alpha + N * beta, rel=1e-12)
    # The β part of the modelled time is β times the bytes the accounting counts.
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        counts = stats[0][kind]
        messages = (2 if kind == "all_reduce" else 1) * (n - 1)
        assert counts["modelled_s"] - messages * alpha == pytest.approx(counts["bytes"] * beta, rel=1e-12)
    for rank_stats in stats:
        for counts in rank_stats.values():
            assert counts["measured_s"] >= 0 and counts["exposed_s"] >= 0


def test_every_operation_takes_at_least_its_modelled_time():
    link = Link("slow", 0.02, 1e-7)  # an all-reduce of 8 KB on 2 ranks: 2·(0.02 + 4000·1e-7) = 0.0408 s

    def rank_fn():
        group = LinkGroup(parallel.world(), link)
        start = time.monotonic()
        group.all_reduce(np.ones(1000))
        blocking = time.monotonic() - start
        start = time.monotonic()
        request = group.all_reduce(np.ones(1000), async_op=True)  # its clock runs while we do other work
        request.wait()
        return blocking, time.monotonic() - start
    modelled = link.seconds("all_reduce", 2, 8000)
    for blocking, non_blocking in run(2, rank_fn):
        assert blocking >= modelled and non_blocking >= modelled


def test_an_all_to_all_takes_a_message_per_peer_and_the_bytes_it_sends():
    link = Link("slow", 0.01, 1e-6)

    def rank_fn():
        group = LinkGroup(parallel.world(), link)
        rows = np.zeros((5, 100))  # 8 bytes × 100 per row; rank r keeps send[r] rows itself
        send = [1, 4] if group.rank == 0 else [2, 3]
        recv = [1, 2] if group.rank == 0 else [4, 3]
        start = time.monotonic()
        group.all_to_all(rows, send, recv)
        return time.monotonic() - start, group.link_stats()["all_to_all"]["modelled_s"]
    (took_0, modelled_0), (took_1, modelled_1) = run(2, rank_fn)
    assert modelled_0 == pytest.approx(0.01 + 4 * 800 * 1e-6) and modelled_1 == pytest.approx(0.01 + 2 * 800 * 1e-6)
    assert took_0 >= modelled_0 and took_1 >= modelled_1


def test_a_split_group_is_on_the_same_link_and_loopback_delays_nothing():
    def rank_fn():
        group = with_link(parallel.world(), "loopback")
        sub = group.split(0)
        sub.all_reduce(np.ones(3))
        return type(sub), sub.link.name, sub.stats()["all_reduce"]["modelled_s"]
    for kind, name, modelled in run(2, rank_fn):
        assert (kind, name, modelled) == (LinkGroup, "loopback", 0.0)


def test_link_profiles_and_their_errors():
    assert set(LINKS) >= {"loopback", "10gbe", "1gbe", "ib-hdr", "nvlink"}
    gbe = parse_link("1gbe")
    assert gbe.alpha == pytest.approx(50e-6) and gbe.beta == pytest.approx(8e-9)
    custom = parse_link("1e-5,2e-9")
    assert (custom.alpha, custom.beta) == (1e-5, 2e-9)
    with pytest.raises(ValueError, match="'fast' is neither a link name"):
        parse_link("fast")
    with pytest.raises(ValueError, match=r"alpha=-1.0 s and beta=0.0 s/byte"):
        parse_link("-1,0")
    assert math.isinf(LINKS["loopback"]["bandwidth_gbps"])


def test_training_on_a_link_gives_the_same_losses_and_reports_exposed_time(capsys):
    flags = ["--threads", "2", "--dp", "2", "--steps", "2", "--n-layer", "1", "--d-model", "32", "--batch", "8"]
    plain = train_main(flags)
    linked = train_main(flags + ["--link", "10gbe"])
    assert plain["losses"] == linked["losses"]
    out = capsys.readouterr().out
    assert "link 10gbe (α = 20 µs, β = 0.8 ns/B), rank 0, last step:" in out
    assert "exposed communication:" in out
