"""`python -m parallel.train --moment-dtype bfloat16` (threads backend): --check against one device
keeping bfloat16 moments under every precision, the flag's one-line error, and a resume that
continues the same losses (or converts the moments to another --moment-dtype)."""
import pytest

from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1"]
TOLERANCE = {"fp64": 1e-12, "bf16": 8e-2, "fp16": 1e-2, "fp8-delayed": 1e-12}  # 16 bits: --check's own


def flags(*extra, steps=2):
    return TINY + ["--steps", str(steps), *extra]


@pytest.mark.parametrize("precision, zero", [("fp64", 3), ("bf16", 2), ("fp16", 1), ("fp8-delayed", 1)])
def test_bf16_moments_pass_the_check_under_every_precision(precision, zero):
    given = [] if precision == "fp64" else ["--precision", precision]
    result = main(flags("--threads", "4", "--dp", "2", "--tp", "2", "--zero", str(zero), "--moment-dtype", "bfloat16",
                        "--check", "4", *given, steps=4))  # step 3 reads the first rounded moments
    assert result["check"] <= TOLERANCE[precision]


@pytest.mark.parametrize("value", ["float16", "bf16", "float64"])
def test_another_moment_dtype_is_a_one_line_error(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(flags("--moment-dtype", value))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"--moment-dtype={value} must be float32 or bfloat16" in err
    assert err.count("\n") == 1


def test_a_resume_with_bf16_moments_continues_the_same_losses(tmp_path, capsys):
    common = ["--moment-dtype", "bfloat16", "--threads", "2", "--dp", "2", "--zero", "1", "--lr", "0.01"]
    whole = main(flags(*common, "--save", str(tmp_path), "--save-every", "2", steps=4))["losses"]
    (after_two,) = tmp_path.glob("step_*2")
    assert main(flags(*common, "--resume", str(after_two), steps=4))["losses"] == whole[2:]  # bit for bit
    converted = main(flags("--threads", "2", "--tp", "2", "--lr", "0.01", "--resume", str(after_two), steps=4))
    assert "kept AdamW's moments in bfloat16; this run keeps them in float32, converted exactly" in capsys.readouterr().out
    assert converted["losses"][0] == pytest.approx(whole[2], rel=1e-6)  # float32 moments (exact), another layout
    plain = main(flags(*common[2:], steps=4))["losses"]
    assert plain[:2] == whole[:2]  # the first step reads the moments unrounded: the same bits after it,
    assert plain[2:] != whole[2:]  # the second reads the rounded ones
