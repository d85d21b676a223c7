"""Chapter 23, FP8 training: the scripts run and print the evidence the README quotes; the
numbers are parsed and checked (the loss curves on a short run: the full one is a claim)."""
import re

import pytest
from chapter_runner import number_after, run_script

CH23 = "tutorials/23_fp8/"


def test_the_formats_their_casts_and_the_outlier_tensor_per_tensor_and_per_tile():
    out = run_script(CH23 + "outliers.py")
    assert "float8_e4m3fn  largest     448" in out and "float8_e5m2    largest   57344" in out
    assert "cast 448 448 nan nan nan nan nan" in out and "saturate 448 448 448 448 448 448 nan" in out
    flushed = {name: float(f) for name, f in re.findall(r"e4m3 (per tensor|per 1x128 tile) *: flushed to zero +(\S+)%",
                                                       out)}
    assert flushed["per tensor"] > 1 and flushed["per 1x128 tile"] == 0
    assert number_after("block-scaled GEMM (K = 300, tiles of 128) vs the dequantized float64 product:", out) < 1e-12


def test_promotion_every_128_keeps_the_error_flat_while_the_limited_accumulator_grows_with_k():
    out = run_script(CH23 + "accumulation.py")
    rows = [(int(k), float(a), float(b)) for k, a, b in re.findall(
        r"K = +(\d+): relative error without promotion (\S+), promoted every 128 (\S+)", out)]
    assert [k for k, _, _ in rows] == [128, 512, 1024, 2048, 4096]
    plain = [a for _, a, _ in rows]
    assert plain == sorted(plain) and plain[-1] > 20 * rows[-1][2]
    assert max(b for _, _, b in rows) <= rows[0][2] * 1.01  # promoted: no worse than one 128-long sum


def test_bf16_moments_save_4_bytes_per_parameter_and_train_alike():
    out = run_script(CH23 + "bf16_moments.py", "--steps", "20", timeout=300)
    assert re.findall(r"beside float32 masters (\d+) bytes per parameter \(planner\), the moments AdamW holds (\d+)",
                      out) == [("12", "8"), ("8", "4")]
    first = re.findall(r"loss after step 1 (\S+),", out)
    assert len(first) == 2 and first[0] == first[1]  # the first step read its moments unrounded
    assert abs(number_after("gap bfloat16 - float32 moments:", out)) < 0.01


@pytest.mark.deep
def test_bf16_and_the_two_fp8_recipes_train_the_addition_gpt_alike():
    out = run_script(CH23 + "loss_curves.py", "--steps", "20", timeout=300)
    gaps = [float(g) for g in re.findall(r"gap fp8-\w+ - bf16: (\S+) in the mean loss", out)]
    assert len(gaps) == 2 and all(abs(g) < 0.05 for g in gaps)
