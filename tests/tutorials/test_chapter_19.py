"""Chapter 19 (finding the strategy): the scripts run and print the evidence the README cites —
the search rediscovering Megatron's split, the two machines where it should not, and stage
boundaries equal to the best of every cut (no timing assertions: measured milliseconds vary)."""
import re

from chapter_runner import number_after, run_script

CH19 = "tutorials/19_finding_the_strategy/"


def test_the_search_rediscovers_megatrons_column_then_row_split():
    out = run_script(CH19 + "rediscover_megatron.py", "--config", "small", "--micro-batch", "2")
    for tp in (2, 4):
        assert f"tp={tp} Megatron's column → row split: yes" in out
        assert number_after(f"tp={tp} forward all-reduces:", out) == 2
        assert number_after(f"tp={tp} backward all-reduces:", out) == 2
        assert re.search(rf"tp={tp} forward all-reduces: 2, other collectives: 0", out)
        searched, replicated = re.search(rf"tp={tp} seconds: searched ([\d.e-]+), replicated ([\d.e-]+)", out).groups()
        assert float(searched) < float(replicated)


def test_a_narrow_block_splits_the_tokens_and_a_slow_link_replicates():
    out = run_script(CH19 + "when_megatron_loses.py")
    narrow, slow = out.split("=== medium block")
    assert "the first projection's output is laid out S(0)" in narrow
    assert "weights split: none" in narrow and "forward all-gather of activations" in narrow
    assert number_after("Megatron / searched =", narrow) > 1
    assert "moves: nothing" in slow and "weights split: none" in slow
    assert number_after("Megatron / searched =", slow) > 2


def test_stage_boundaries_by_time_are_the_best_cut():
    out = run_script(CH19 + "stage_boundaries.py")
    assert "DP equals it: yes" in out
    by_time = re.search(r"balance by measured time \(DP\): \[([\d, ]+)\]", out).group(1)
    best = re.search(r"cuts: \[([\d, ]+)\]", out).group(1)
    slowest = [float(x) for x in re.findall(r"slowest stage ([\d.]+) ms", out)]
    assert sum(map(int, by_time.split(","))) == 8
    assert slowest[0] == slowest[2] and slowest[0] <= slowest[1]   # DP = brute force ≤ by parameters
    assert best and number_after("speed-up", out) > 0
    low, high, weight = re.search(r"the same cut for a head of ([\d.]+) to ([\d.]+|inf) blocks; yours weighs ([\d.]+)",
                                  out).groups()
    assert float(low) <= float(weight) <= float(high)  # the measured head lies inside the range printed for its cut
