"""Chapter 11 (zero-bubble pipelines): the scripts run (threads, and mpiexec for the timelines)
and print the evidence the README talks about; the numbers are parsed and checked."""
import re

import pytest
from chapter_runner import mpi, number_after, numbers_after, run_script

CH11 = "tutorials/11_zero_bubble/"
EXACT = 1e-12   # float64 differences to one device are round-off (the contract is 1e-9 relative)


def test_split_by_hand_b_then_w_is_bitwise_one_backward():
    out = run_script(CH11 + "split_by_hand.py")
    assert numbers_after("by hand vs engine, largest difference:", out) == [0, 0, 0]
    assert "after B: x.grad set: True, W.grad set: False, b.grad set: False" in out
    assert number_after("B then W vs backward, largest difference:", out) == 0
    flops = re.search(r"flops F \(x·Wᵀ\), B \(dy·W\), W \(dyᵀ·x\): (\d+), (\d+), (\d+)", out).groups()
    assert len(set(flops)) == 1
    assert "nodes whose weight products wait for W: {'Linear': 13}" in out  # 6 per block + lm_head
    assert number_after("parameters with a gradient after B:", out) == 0
    saved, kept, dy = (int(n.replace(",", "")) for n in re.search(
        r"bytes saved for backward: ([\d,]+); kept from B to W: ([\d,]+) \(of which the waiting "
        r"nodes' output gradients dy: ([\d,]+)\)", out).groups())
    assert 0 < dy < kept and kept - dy <= saved  # W keeps dy and part of what forward saved
    assert number_after("B then W vs backward on the GPT, largest difference:", out) == 0


@pytest.mark.parametrize("how", [{"threads": 4}, mpi(2)], ids=["threads4", "mpi2"])
def test_three_timelines_simulated_bubbles_peaks_and_equal_gradients(how):
    out = run_script(CH11 + "three_timelines.py", **how)
    p = how.get("threads", how.get("mpi_ranks"))
    simulated = {name: number_after(f"{name} simulated bubble:", out) for name in ("1f1b", "zb-h1", "zb-h2")}
    assert simulated == {"1f1b": 0.2727, "zb-h1": 0.1111, "zb-h2": 0.1111}
    assert numbers_after("(closed form", out) == [0.2727, 0.1111, 0.1111]
    assert number_after("zb-h2 bubble inside the ranks' spans:", out) == 0
    assert number_after("zb-h1 bubble inside the ranks' spans:", out) > 0
    assert "1f1b simulated peak stored micro-batches per stage: [4, 3, 2, 1]" in out
    assert "zb-h1 simulated peak stored micro-batches per stage: [4, 4, 4, 4]" in out
    assert "zb-h2 simulated peak stored micro-batches per stage: [7, 7, 7, 7]" in out
    assert "W0" in out.split("zb-h1:")[1].split("zb-h1 simulated")[0]
    assert all(d <= EXACT for d in numbers_after("largest gradient difference", out))
    assert numbers_after("gradients, largest difference:", out) == [0, 0]
    assert f"zb-h1 peak stored micro-batches per stage: {[min(p, 8)] * p}" in out
    assert f"zb-h2 peak stored micro-batches per stage: {[min(2 * p - 1, 8)] * p}" in out
    assert all(0 < b < 1 for b in numbers_after("measured bubble", out))


def test_optimizer_step_overlap_only_pays_for_zb_h2_and_post_validation_is_exact():
    out = run_script(CH11 + "optimizer_step.py", threads=2)
    rows = {name: (int(sync), int(overlap)) for name, sync, overlap in re.findall(
        r"(\S+)\s+synchronous optimizer step: (\d+) units per step; steps overlapping: (\d+) units", out)}
    assert rows == {"1f1b": (33, 33), "zb-h1": (27, 27), "zb-h2": (27, 24)}  # 24 = 3m: no bubble at all
    assert number_after("synchronous vs post-validated parameters, largest difference:", out) == 0
    rolled, steps = re.search(r"steps rolled back: (\d+) of (\d+)", out).groups()
    assert 0 < int(rolled) < int(steps)  # both paths ran
