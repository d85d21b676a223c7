"""`python -m parallel.train --precision fp8-current | fp8-delayed | fp8-blockwise` (threads backend): --check
with context parallelism, the flags' one-line errors, and a resume that continues the losses."""
import numpy as np
import pytest

from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1"]


def flags(*extra, steps=2):
    return TINY + ["--steps", str(steps), *extra]


def test_cp_with_sequence_parallel_and_fp8_blockwise_passes_the_check(capsys):
    result = main(flags("--threads", "4", "--cp", "2", "--tp", "2", "--cp-layout", "contiguous", "--sequence-parallel",
                        "--precision", "fp8-blockwise", "--fp8-tile", "4", "--check"))
    assert result["check"] <= 1e-9
    assert "precision fp8-blockwise: the blocks' linears on FP8 operands (e4m3, 1x4 tiles" in capsys.readouterr().out


@pytest.mark.parametrize("layout", [["--threads", "4", "--dp", "4", "--ep", "2", "--precision", "fp8-delayed"],
                                    ["--threads", "4", "--dp", "4", "--ep", "2", "--zero", "3", "--shared-experts", "1",
                                     "--precision", "fp8-blockwise", "--fp8-tile", "4"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--pp", "2", "--microbatches", "2",
                                     "--zero", "2", "--precision", "fp8-delayed"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--tp", "2", "--precision", "fp8-blockwise",
                                     "--fp8-tile", "4"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--cp", "2", "--zero", "2",
                                     "--precision", "fp8-delayed"]])
def test_experts_under_fp8_pass_the_check(layout, capsys):
    """The experts' linears in FP8 (amaxes MAX-reduced over their replicas, edp), the router not: one device
    running the same recipe, to 1e-9 (float64 around the FP8 products)."""
    result = main(flags("--experts", "4", *layout, "--check", "3", steps=3))
    assert result["check"] <= 1e-9 and capsys.readouterr().out.count("check step") == 3


@pytest.mark.parametrize("layout", [["--threads", "2", "--dp", "2"], ["--threads", "2", "--tp", "2"],
                                    ["--threads", "2", "--pp", "2", "--microbatches", "2"],
                                    ["--threads", "4", "--cp", "2", "--tp", "2", "--sequence-parallel"],
                                    ["--threads", "4", "--dp", "2", "--tp", "2", "--zero", "3"],
                                    ["--threads", "4", "--dp", "4", "--ep", "2", "--experts", "4", "--zero", "2"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--tp", "2", "--experts", "4",
                                     "--shared-experts", "1"]])
def test_fp8_current_passes_the_check_in_every_layout(layout, capsys):
    """Each cast scales by the amax of the whole tensor one device casts: MAX-reduced over tp, dp × cp
    (a routed expert's: edp) as it casts, so every layout quantizes the same values with the same scale."""
    result = main(flags(*layout, "--precision", "fp8-current", "--check", "3", steps=3))
    assert result["check"] <= 1e-9 and capsys.readouterr().out.count("check step") == 3


def test_fp8_current_changes_the_numbers_from_the_plain_run_and_from_fp8_delayed():
    runs = {name: main(flags("--threads", "2", "--dp", "2", *extra, steps=3))["losses"]
            for name, extra in (("plain", []), ("current", ["--precision", "fp8-current"]),
                                ("delayed", ["--precision", "fp8-delayed"]))}
    assert not np.allclose(runs["current"], runs["plain"], rtol=1e-6, atol=0)
    assert not np.allclose(runs["current"], runs["delayed"], rtol=1e-6, atol=0)  # delayed's first step casts at 1


@pytest.mark.parametrize("extra, message", [
    (["--precision", "fp8-delayed", "--fp8-margin", "-1"], "--fp8-margin=-1 must be ≥ 0"),
    (["--precision", "fp8-current", "--fp8-margin", "-1"], "--fp8-margin=-1 must be ≥ 0"),
    (["--precision", "fp8-delayed", "--fp8-history", "0"], "--fp8-history=0 must be ≥ 1"),
    (["--precision", "fp8-blockwise"], "--fp8-tile 128 does not divide --d-model = 16"),
    (["--precision", "fp8-blockwise", "--fp8-tile", "16", "--threads", "2", "--tp", "2"],
     "--fp8-tile 16 does not divide --d-model / --tp = 8"),
    (["--precision", "fp8-blockwise", "--fp8-tile", "8", "--threads", "2", "--cp", "2"],
     "--fp8-tile 8 does not divide the tokens in a row on one rank (T/cp, zigzag: T/(2cp)) = 2"),
    (["--precision", "fp8-delayed", "--check", "--dtype", "float32"], "an fp8 recipe is compared in float64"),
    (["--precision", "fp8-delayed", "--dtype", "float64"], "--precision fp8-delayed with --dtype float64: FP8 operands"),
])
def test_bad_fp8_flags_are_one_line_errors(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(flags(*extra))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("\n") == 1


def test_a_resume_under_fp8_delayed_continues_the_same_losses(tmp_path):
    common = ["--precision", "fp8-delayed", "--fp8-history", "4", "--threads", "2", "--tp", "2"]
    whole = main(flags(*common, "--save", str(tmp_path), "--save-every", "2", steps=4))["losses"]
    (after_two,) = tmp_path.glob("step_*2")
    resumed = main(flags(*common, "--resume", str(after_two), steps=4))["losses"]
    assert resumed == whole[2:]  # bit for bit: the amax histories came back with the weights and moments
    plain = main(flags("--threads", "2", "--tp", "2", steps=4))["losses"]
    assert not np.allclose(whole, plain, rtol=1e-6, atol=0)  # and FP8 was on


def test_a_resume_under_fp8_with_experts_continues_in_its_layout_and_in_another(tmp_path):
    common = ["--experts", "4", "--precision", "fp8-delayed", "--fp8-history", "4"]
    whole = main(flags(*common, "--threads", "4", "--dp", "4", "--ep", "2", "--save", str(tmp_path), "--save-every", "2",
                       steps=4))["losses"]
    (after_two,) = tmp_path.glob("step_*2")
    resumed = main(flags(*common, "--threads", "4", "--dp", "4", "--ep", "2", "--resume", str(after_two), steps=4))
    assert resumed["losses"] == whole[2:]  # every expert's amax history came back under its single-device name
    resharded = main(flags(*common, "--threads", "2", "--dp", "2", "--resume", str(after_two), steps=4))
    np.testing.assert_allclose(resharded["losses"], whole[2:], rtol=1e-5)  # float32 sums in another order
