"""Chapter 22's planner section: the GPU-cluster planner picks interleaving under full recomputation,
DualPipe under selective recomputation when its 2× parameters fit, and DualPipeV when they do not."""
import re

from chapter_runner import run_script


def test_the_planner_picks_interleaving_dualpipe_and_dualpipev_each_where_it_wins():
    out = run_script("tutorials/22_dualpipe/planner_picks.py")
    assert re.findall(r"picked: (.+)", out) == ["interleaved v=6", "dualpipe", "dualpipev"]
    full, roomy, tight = out.split("recomputation, ")[1:]
    memory = {name: float(gib) for name, gib in re.findall(r"^  (\w+) +step .* memory +(\S+) GiB", roomy, re.M)}
    assert memory["dualpipe"] > 60 > memory["dualpipev"]          # the second copy is what 60 GiB cannot hold
    assert "dualpipe " not in tight and "dualpipe " in full
