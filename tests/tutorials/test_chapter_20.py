"""Chapter 20, mixture of experts: the balancing loss evens the experts' load, the dispatch
all-to-all moves every routed row once, most of them across ranks, and the device limit cuts
the rows, one per (token, rank)."""
import importlib.util
import re

import pytest
from chapter_runner import run_script


def test_routing_balances_with_the_aux_loss_and_the_dispatch_grid_adds_up():
    out = run_script("tutorials/20_mixture_of_experts/routing.py")
    last = [float(line.split(" | ")[0].split()[-1]) for line in out.splitlines() if line.startswith("balancing loss")]
    assert len(last) == 3 and last[2] < last[0]  # α = 0.01 spreads the tokens that α = 0 piles up
    grid = [[int(n) for n in line.split()] for line in out.split("ep=4:\n")[1].splitlines()[:4]]
    total, diagonal = sum(map(sum, grid)), sum(grid[i][i] for i in range(4))
    assert total == 4 * 8 * 8  # 4 ranks × 8 sequences × 8 tokens, top-1: one row each
    assert f"rows that cross ranks: {total - diagonal} of {total}" in out


def test_balance_compares_the_aux_loss_with_loss_free_balancing():
    out = run_script("tutorials/20_mixture_of_experts/balance.py", "--steps", "20")
    runs = dict(re.findall(r"^(.+?)\s+MaxVio (\S+) ", out, re.MULTILINE))
    assert set(runs) == {"no balancing", "aux loss α=0.01", "loss-free γ=0.01", "loss-free γ=0.03", "random router"}
    assert 0 < float(runs["random router"]) < min(float(v) for k, v in runs.items() if k != "random router")


def test_scope_compares_the_balancing_loss_per_sequence_and_per_batch():
    out = run_script("tutorials/20_mixture_of_experts/scope.py", "--steps", "20")
    rows = {name: [float(v) for v in values] for name, *values in re.findall(
        r"^(.+?)\s+MaxVio per sequence (\S+)  per batch (\S+)  domains apart (\S+)  loss (\S+)$", out, re.MULTILINE)}
    assert set(rows) == {"no balancing", "sequence α=0.1", "batch α=0.1"}
    assert all(0 <= row[2] <= 1 for row in rows.values())  # a total variation
    for scope in ("sequence α=0.1", "batch α=0.1"):  # either loss evens the batch
        assert rows[scope][1] < rows["no balancing"][1]


def test_the_device_limit_caps_the_ranks_a_token_reaches_and_the_bytes_fall_with_it():
    out = run_script("tutorials/20_mixture_of_experts/fan_out.py")
    rows = re.findall(r"^M=(\d): \[(.+?)\] .* \| ([\d,]+), planner ([\d,]+)$", out, re.M)
    reach = {int(m): [int(n) for n in counts.split(", ")] for m, counts, _, _ in rows}
    assert list(reach) == [4, 3, 2, 1] and len({sum(r) for r in reach.values()}) == 1  # every token counted once
    assert all(not any(r[m:]) for m, r in reach.items()) and any(reach[4][3:])  # capped, and the cap binds
    assert out.count("(equal)") == 4
    mean = [int(counted.replace(",", "")) for _, _, counted, _ in rows]
    assert mean == sorted(mean, reverse=True) and mean[-1] < mean[0] / 2  # one row per (token, rank): fewer ranks, fewer bytes
    for (_, _, counted, planner) in rows:  # the planner's uniform estimate, capped at M, within 10%
        assert abs(int(counted.replace(",", "")) / int(planner.replace(",", "")) - 1) < 0.1


def test_routing_refuses_a_step_count_below_one_in_one_line(capsys):
    spec = importlib.util.spec_from_file_location("routing", "tutorials/20_mixture_of_experts/routing.py")
    routing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(routing)
    with pytest.raises(SystemExit) as exit_info:
        routing.main(["--steps", "-5"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith("--steps=-5 must be ≥ 1")
