"""Chapter 21 (flash attention): the scripts run and print the evidence the README talks about;
the numbers are parsed and checked."""
import re

from chapter_runner import number_after, run_script

CH21 = "tutorials/21_flash_attention/"
EXACT = 1e-12  # float64 differences to the dense computation are round-off


def test_the_online_softmax_over_tiles_equals_the_softmax_and_survives_huge_scores():
    out = run_script(CH21 + "online_softmax_tiles.py")
    assert number_after("tiles vs all at once, largest difference:", out) <= EXACT
    assert "after keys 2-3: m = 4.000000, l = 1.447864" in out  # the max moved: the old sum was rescaled
    assert "scores x 1000: m = 4000.0, O = [2. 0.] (the naive e^s is inf: True)" in out


def test_the_tile_map_skips_the_blocks_above_the_diagonal_and_flash_equals_dense():
    out = run_script(CH21 + "tiles.py")
    assert "tiles: 4 whole, 5 on the diagonal, 3 skipped of 12" in out
    diffs = re.search(r"output, dq, dk, dv: (\S+), (\S+), (\S+), (\S+); of L vs log-sum-exp: (\S+)$", out, re.M)
    assert all(float(d) <= EXACT for d in diffs.groups())
    assert number_after("loss difference", out) <= EXACT
    assert number_after("largest gradient difference", out) <= EXACT


def test_saved_bytes_are_the_formulas_quadratic_for_dense_linear_for_flash():
    out = run_script(CH21 + "saved_bytes.py", "--lengths", 256, 512, 1024)
    rows = [[int(x.replace(",", "")) for x in line.split()[:3] + line.split()[4:6]]
            for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [row[0] for row in rows] == [256, 512, 1024]
    for t, dense, flash, dense_formula, flash_formula in rows:
        assert (dense, flash) == (dense_formula, flash_formula), t
    assert rows[2][2] == 4 * rows[0][2] and rows[2][1] > 9 * rows[0][1]  # 4x T: flash 4x, dense ~16x
