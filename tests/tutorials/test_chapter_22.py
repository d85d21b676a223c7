"""Chapter 22 (DualPipeV): the scripts run (threads, and mpiexec for the V's real step) and print
the evidence the README talks about; the numbers are parsed and checked."""
import re

import pytest
from chapter_runner import mpi, numbers_after, run_script

CH22 = "tutorials/22_dualpipe/"


@pytest.mark.parametrize("how", [{"threads": 2}, mpi(2)], ids=["threads2", "mpi2"])
def test_v_timeline_idles_as_table_2_says_and_a_real_step_equals_one_device(how):
    out = run_script(CH22 + "v_timeline.py", **how)
    for name, idle in (("1f1b", 21), ("dualpipev", 6)):
        assert f"{name} idle time per rank: {idle} units (table 2's formula {idle})" in out
    assert "dualpipev peak stored graphs per rank: [9, 9, 9, 9]" in out
    assert re.search(r"^rank 3 \| \.   \.   \.   F0a F0b F1a F1b", out, re.M)  # the turn of the V on the last rank
    assert all(d <= 1e-12 for d in numbers_after("loss difference", out) + numbers_after("gradient difference", out))
    assert "rank 0 holds stages 0 and 3; peak stored graphs 5" in out
    assert "rank 1 holds stages 1 and 2; peak stored graphs 5" in out


def test_interleaving_beats_dualpipev_from_four_chunks_and_the_v_stacks_the_ends_on_rank_0():
    out = run_script(CH22 + "against_interleaving.py")
    idle = {int(v): float(t) for v, t in re.findall(r"interleaved v = (\d+): idle per rank (\S+) ", out)}
    assert idle == {1: 18, 2: 9, 4: 4.5, 8: 2.25}
    dualpipev = float(re.search(r"dualpipev: idle per rank (\S+) ", out).group(1))
    assert idle[2] > dualpipev > idle[4]
    ranks = [int(n) for n in re.search(r"DualPipeV V: .* per rank \[([\d, ]+)\]", out).group(1).split(",")]
    assert ranks[0] == max(ranks) and ranks[-1] == min(ranks)


@pytest.mark.parametrize("how", [{"threads": 2}, mpi(2)], ids=["threads2", "mpi2"])
def test_dualpipe_idles_as_the_v_and_its_copies_sum_to_one_device(how):
    out = run_script(CH22 + "two_directions.py", **how)
    assert "dualpipe idle time per rank: 6 units (table 2's formula 6)" in out
    assert "dualpipe peak stored graphs per rank: [9, 9, 9, 9, 9, 9, 9, 9]" in out
    assert re.search(r"^rank 7 \| F10b F11b F12b", out, re.M)  # the up direction enters at the last rank
    alone = [float(d) for d in re.findall(r"its gradient alone is off one device's by (\S+) ", out)]
    assert len(alone) == 4 and min(alone) > 0.3  # each copy saw half the micro-batches
    assert all(d <= 1e-12 for d in numbers_after("loss difference", out) + numbers_after("relative gradient difference", out))
    assert "parameters per rank [409216, 409216]; one device 409,216" in out
