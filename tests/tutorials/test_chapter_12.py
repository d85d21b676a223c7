"""Chapter 12 (communication-efficient data parallelism): the scripts run (threads, and
mpiexec for the link) and print the evidence the README talks about; the numbers are
parsed and checked. Nothing here depends on timing beyond "at least the modelled time"."""
import re

import pytest
from chapter_runner import mpi, number_after, run_script

CH12 = "tutorials/12_communication/"
TIMEOUT = 600  # a few seconds to a minute on a quiet machine; these train small models


@pytest.mark.parametrize("how", [{"threads": 2}, mpi(2)], ids=["threads2", "mpi2"])
def test_slow_link_models_each_link_and_changes_no_bit(how):
    out = run_script(CH12 + "slow_link.py", timeout=TIMEOUT, **how)
    assert number_after("default model:", out) == 400896
    nbytes = number_after("gradient bytes:", out)
    assert nbytes == 4 * 400896
    alpha, beta = 50e-6, 1 / 0.125e9  # 1gbe
    assert number_after("1gbe      α    50 µs   0.125 GB/s  modelled all-reduce", out) == pytest.approx(
        2 * (alpha + nbytes / 2 * beta), abs=1e-6)
    assert number_after("loopback  α     0 µs     inf GB/s  modelled all-reduce", out) == 0
    assert "at least the modelled time: True" in out
    assert "result bit for bit the plain group's on every rank: True" in out


def test_overlap_starts_buckets_during_backward_and_changes_no_gradient():
    out = run_script(CH12 + "overlap.py", timeout=TIMEOUT, threads=2)
    buckets = int(re.search(r"(\d+) buckets of", out).group(1))
    on = re.search(r"overlap on : buckets started before the last gradient was ready: (\d+) of (\d+); "
                   r"modelled comm ([0-9.]+) s, exposed comm ([0-9.]+) s", out).groups()
    off = re.search(r"overlap off: buckets started before the last gradient was ready: (\d+) of (\d+); "
                    r"modelled comm ([0-9.]+) s, exposed comm ([0-9.]+) s", out).groups()
    assert buckets > 2 and (int(on[0]), int(on[1])) == (buckets - 1, buckets) and int(off[0]) == 0
    assert on[2] == off[2] and float(on[2]) > 0  # the same modelled communication either way
    assert "gradients bit for bit equal with and without overlap: True" in out
    hidden = number_after("hidden by overlap (virtual exposed off − on):", out)  # the virtual clock: load-proof
    assert 0 <= hidden <= float(on[2])


def test_without_error_feedback_topk_trains_worse():
    out = run_script(CH12 + "error_feedback.py", timeout=TIMEOUT, threads=2)
    plain = number_after("all-reduce                       loss", out)
    with_ef = number_after("top-k 1% with error feedback     loss", out)
    without = number_after("top-k 1% without error feedback  loss", out)
    assert plain < with_ef < without
    assert number_after("loss without error feedback minus with:", out) > 0.02
    sizes = [float(s.replace(",", "")) for s in re.findall(r"bytes per step per rank +([\d,]+)", out)]
    assert sizes[0] > 30 * sizes[1] and sizes[1] == sizes[2]
