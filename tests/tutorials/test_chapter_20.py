"""Chapter 20, mixture of experts: the balancing loss evens the experts' load, and the
dispatch all-to-all moves every routed row once, most of them across ranks."""
import importlib.util
import re

import pytest
from chapter_runner import run_script


def test_routing_balances_with_the_aux_loss_and_the_dispatch_grid_adds_up():
    out = run_script("tutorials/20_mixture_of_experts/routing.py")
    ratios = [float(x) for x in re.findall(r"max/mean (\S+)", out)]
    assert len(ratios) == 2 and ratios[1] < ratios[0]  # α = 0.01 spreads the tokens that α = 0 piles up
    grid = [[int(n) for n in line.split()] for line in out.split("ep=4:\n")[1].splitlines()[:4]]
    total, diagonal = sum(map(sum, grid)), sum(grid[i][i] for i in range(4))
    assert total == 4 * 8 * 8  # 4 ranks × 8 sequences × 8 tokens, top-1: one row each
    assert f"rows that cross ranks: {total - diagonal} of {total}" in out


def test_routing_refuses_a_step_count_below_one_in_one_line(capsys):
    spec = importlib.util.spec_from_file_location("routing", "tutorials/20_mixture_of_experts/routing.py")
    routing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(routing)
    with pytest.raises(SystemExit) as exit_info:
        routing.main(["--steps", "-5"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith("--steps=-5 must be ≥ 1")
