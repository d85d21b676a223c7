"""`python -m parallel.bench moe`: the all-to-all's counted bytes equal the formula, and the
table has the dense model and the MoE with and without the balancing loss."""
from parallel.bench import moe


def test_a_short_moe_bench_counts_the_formula_and_prints_three_models(capsys):
    assert moe.main(["--steps", "12", "--experts", "4", "--ep", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("all-to-all bytes per step, rank 0 of ep=2, E=4, top-2: counted ") and "(equal)" in out[0]
    rows = [line.split() for line in out[2:]]
    assert [row[0] for row in rows] == ["dense", "MoE", "MoE"] and rows[0][-1] == "-"
    assert all(1.0 <= float(row[-1]) <= 4.0 for row in rows[1:])  # max/mean load lies in [1, E]
