"""Chapter 9 (3D parallelism): the scripts run as 8 threads and under mpiexec -n 8, and print
the evidence the README talks about: the grid and its groups, per-rank parameters and
per-group communication equal to the formula (recomputed here), every layout equal to
one device within 1e-9, and the main job's --check lines."""
import re

import pytest
from chapter_runner import mpi, number_after, numbers_after, run_script

CH9 = "tutorials/09_3d/"
TOLERANCE = 1e-9
MESH_ORDER = ("tp", "dp", "pp")


def test_mesh_grid_tp_neighbours_then_dp_then_pp():
    out = run_script(CH9 + "mesh_grid.py", threads=8)
    assert "mesh dp=2 x tp=2 x pp=2 over 8 ranks (tp fastest, then dp, then pp)" in out
    picture = out.split("pp stage 0")[1].split("this is rank")[0]
    assert re.findall(r"dp(\d)\s+(\d)\s+(\d)", picture) == [("0", "0", "1"), ("1", "2", "3"),
                                                           ("0", "4", "5"), ("1", "6", "7")]
    rows = re.findall(r"rank (\d): dp (\d), tp (\d), pp (\d)\s+tp group \[(\d), (\d)\]\s+dp group \[(\d), (\d)\]"
                      r"\s+pp group \[(\d), (\d)\]", out)
    assert len(rows) == 8
    for rank, dp, tp, pp, *members in (tuple(map(int, r)) for r in rows):
        assert rank == pp * 4 + dp * 2 + tp
        tp_group, dp_group, pp_group = members[0:2], members[2:4], members[4:6]
        assert rank in tp_group and rank in dp_group and rank in pp_group
        assert tp_group == [pp * 4 + dp * 2 + t for t in range(2)]
        assert dp_group == [pp * 4 + d * 2 + tp for d in range(2)]
        assert pp_group == [p * 4 + dp * 2 + tp for p in range(2)]
    strides = [number_after(f"{axis} neighbours are", out) for axis in MESH_ORDER]
    inside = [re.search(rf"{axis} neighbours.*inside one node: (\d) of (\d)", out).groups() for axis in MESH_ORDER]
    assert strides == [1, 2, 4] and inside == [("4", "4"), ("4", "4"), ("0", "4")]


def expected_counts(stage, num_stages, blocks, b, T, C, m, params, sizes):
    """The step's (calls, elements) per (group, kind), derived here independently of the script;
    a group of one rank (sizes: {"dp": .., "tp": .., "pp": ..}) moves nothing and is not listed."""
    first, last, act = stage == 0, stage == num_stages - 1, b * T * C
    p2p = m * ((not first) + (not last))
    counts = {("tp", "all_reduce"): (m * (4 * blocks + first + 3 * last),
                                     m * ((4 * blocks + first + last) * act + 3 * b * T * last)),
              ("pp", "send"): (p2p, p2p * act), ("pp", "recv"): (p2p, p2p * act),
              ("pp", "broadcast"): (1, 1), ("pp", "barrier"): (1, 0), ("dp", "all_reduce"): (2, params + 1)}
    return {k: v for k, v in counts.items() if v[0] and sizes[k[0]] > 1}


def check_compose(out, dp, tp, pp):
    per_rank = re.findall(r"rank \d+ \(dp \d+, tp \d+, pp \d+\) stage \d+: .*?: ([\d,]+) parameters; "
                          r"blocks\.\d+\.mlp\.fc\.weight \((\d+), (\d+)\) of \((\d+), (\d+)\), "
                          r"blocks\.\d+\.attn\.proj\.weight \((\d+), (\d+)\) of \((\d+), (\d+)\)", out)
    assert len(per_rank) == dp * tp * pp
    for _, *shape in per_rank:
        fc_rows, fc_cols, fc_full_rows, fc_full_cols, pr_rows, pr_cols, pr_full_rows, pr_full_cols = map(int, shape)
        assert (fc_rows * tp, fc_cols) == (fc_full_rows, fc_full_cols)       # column-parallel: rows split
        assert (pr_rows, pr_cols * tp) == (pr_full_rows, pr_full_cols)       # row-parallel: columns split
    replica = re.search(r"holds ([\d,]+) parameters; formula: dense ([\d,]+) \+ \(tp-1\) x replicated ([\d,]+)", out)
    held, dense, replicated = (int(v.replace(",", "")) for v in replica.groups())
    assert held == dense + (tp - 1) * replicated and (replicated > 0) and (held > dense) == (tp > 1)
    _, T, m, b, C = (int(v) for v in re.search(r"one step: global batch (\d+) x (\d+), m = (\d+) micro-batches "
                                               r"of b = (\d+) row\(s\) per dp rank, C = (\d+)", out).groups())
    sections = re.findall(r"rank \d+ \(stage (\d+), L = (\d+) blocks, ([\d,]+) parameters\), counted \| formula:\n"
                          r"((?:  \w+ \w+ +counted.*\n?)+)", out)
    assert [int(s[0]) for s in sections] == sorted({0, pp - 1})
    for stage, blocks, params, body in sections:
        counted = {(g, k): (int(c), int(e)) for g, k, c, e in
                   re.findall(r"  (\w+) (\w+) +counted +(\d+) calls +(\d+) elements", body)}
        assert counted == expected_counts(int(stage), pp, int(blocks), b, T, C, m, int(params.replace(",", "")),
                                             {"dp": dp, "tp": tp, "pp": pp})
    assert f"ranks whose counts equal the formula: {dp * tp * pp} of {dp * tp * pp}" in out


@pytest.mark.parametrize("layout, how", [((2, 2, 2), {"threads": 8}), ((1, 2, 4), {"threads": 8}),
                                         ((2, 2, 2), {"mpi_ranks": 8})], ids=["222-threads8", "124-threads8", "222-mpi8"])
def test_compose_parameters_and_communication_equal_the_formula(layout, how):
    dp, tp, pp = layout
    out = run_script(CH9 + "compose.py", "--dp", dp, "--tp", tp, "--pp", pp, **how)
    check_compose(out, dp, tp, pp)


def layout_rows(out):
    return [(tuple(map(int, r[:3])), *map(float, r[3:])) for r in re.findall(
        r"dp=(\d) tp=(\d) pp=(\d):\s+loss (\S+)\s+gradients (\S+) \(\S+\)\s+parameters (\S+) \(\S+\)", out)]


def test_six_layouts_of_eight_threads_equal_one_device_over_three_steps():
    out = run_script(CH9 + "check_layouts.py", threads=8, timeout=300)  # ~14 s on a busy machine: a hang bound
    rows = layout_rows(out)
    assert [r[0] for r in rows] == [(2, 2, 2), (1, 2, 4), (4, 2, 1), (2, 4, 1), (8, 1, 1), (1, 1, 8)]
    assert all(0 <= d <= TOLERANCE for row in rows for d in row[1:])
    assert number_after("largest over 6 layout(s) x 3 step(s):", out) <= TOLERANCE
    assert out.rstrip().endswith("equal")


def test_layouts_with_sequence_parallel_and_zero_under_mpiexec():
    out = run_script(CH9 + "check_layouts.py", "--layouts", "2,2,2 2,4,1", "--steps", "2",
                     "--sequence-parallel", "--zero", mpi_ranks=8)
    assert "mpi backend" in out and "sequence parallel, ZeRO-1" in out
    rows = layout_rows(out)
    assert [r[0] for r in rows] == [(2, 2, 2), (2, 4, 1)]
    assert all(0 <= d <= TOLERANCE for row in rows for d in row[1:])


@pytest.mark.parametrize("how", [{"threads": 8}, mpi(8)], ids=["threads8", "mpi8"])
def test_main_job_check_lines(how):
    out = run_script(CH9 + "main_job_check.py", "--dp", 1, "--tp", 2, "--pp", 4, **how)
    assert out.startswith("python -m parallel.train --dp 1 --tp 2 --pp 4 ")
    assert "mesh dp=1 x tp=2 x pp=4 over 8 ranks" in out
    steps = re.findall(r"check step (\d): loss \S+, relative loss difference (\S+), "
                       r"largest relative gradient difference (\S+) \(\S+\) vs one device", out)
    assert [int(s[0]) for s in steps] == [1, 2, 3]
    assert all(float(d) <= TOLERANCE for s in steps for d in s[1:])
    worst = numbers_after("largest relative difference to one device over 3 step(s):", out)
    assert len(worst) == 1 and worst[0] == max(float(d) for s in steps for d in s[1:])
