"""Chapter 16 (context parallelism): the scripts run (threads, and mpiexec for the ring) and print
the evidence the README talks about; the numbers are parsed and checked."""
import re

import pytest
from chapter_runner import mpi, number_after, numbers_after, run_script

CH16 = "tutorials/16_context_parallel/"
EXACT = 1e-12   # float64 differences to full attention or one device are round-off


def test_online_softmax_merge_equals_softmax_and_survives_huge_scores():
    out = run_script(CH16 + "online_softmax.py")
    assert number_after("merged vs full softmax, largest difference:", out) <= EXACT
    assert number_after("merged vs full softmax at scores x 1000, largest difference:", out) <= EXACT
    assert "the naive sum of e^s is inf (overflow: True)" in out
    assert number_after("block 1 (keys 0, 1): L1 = log(e^1 + e^2) =", out) == 2.313262
    assert "merged: L = log(e^L1 + e^L2) = 3.460773" in out


def test_work_table_contiguous_idles_ranks_zigzag_balances_and_the_counts_equal_the_formula():
    out = run_script(CH16 + "work_table.py")
    contiguous = numbers_after("contiguous", out.split("ring attention")[0])
    assert [round(r, 3) for r in numbers_after("busiest / mean", out)] == [1.5, 1.0, 1.75, 1.0, 1.875, 1.0]
    assert numbers_after("(2·cp−1)/cp =", out) == [1.5, 1.75, 1.875]
    assert contiguous[0] == 131  # rank 0 of cp 2: half its own block of 512
    assert out.count("counted equals formula: True") == 2


@pytest.mark.parametrize("how", [{"threads": 4}, mpi(2)], ids=["threads4", "mpi2"])
def test_the_ring_steps_its_exactness_and_its_traffic(how):
    out = run_script(CH16 + "ring.py", **how)
    cp = how.get("threads", how.get("mpi_ranks"))
    assert len(re.findall(r"^step \d+:$", out, re.M)) == cp
    assert len(re.findall(r"sends it on to rank", out)) == cp * (cp - 1)
    diffs = re.search(r"largest difference of output, dq, dk, dv: (\S+), (\S+), (\S+), (\S+)$", out, re.M).groups()
    assert all(float(d) <= EXACT for d in diffs)
    counted, formula = re.search(r"\(counted \| formula\): (\d+) \| (\d+)", out).groups()
    assert counted == formula
    if cp == 4:
        assert "mesh dp=1 x tp=2 x pp=1 x cp=2 over 4 ranks (tp fastest, then cp, then dp, then pp)" in out
        assert number_after("loss difference", out) <= EXACT
        assert number_after("largest relative gradient difference", out) <= 1e-9
