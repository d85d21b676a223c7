"""Every program checks its numeric flags before any work, in one message form (minitensor.flags):
argparse's exit 2 with one line naming the flag and its value."""
import pytest

import minitensor.bench
import parallel.bench.allreduce
import parallel.bench.dp
import parallel.bench.pp
import parallel.bench.prune
import parallel.bench.tp
import parallel.bench.zero
import parallel.plan.__main__ as plan_cli
import parallel.smaller_models.__main__ as smaller_models_cli
from minitensor.flags import AT_LEAST_0, AT_LEAST_1, NON_NEGATIVE, POSITIVE, bad_flag

PLAN = ["--config", "medium", "--devices", "4"]


@pytest.mark.parametrize("main, argv, message", [
    (minitensor.bench.main, ["--steps", "0", "--no-torch"], "--steps=0 must be ≥ 1"),
    (minitensor.bench.main, ["--warmup", "-1", "--no-torch"], "--warmup=-1 must be ≥ 0"),
    (parallel.bench.allreduce.main, ["--ranks", "2", "0"], "--ranks=0 must be ≥ 1"),
    (parallel.bench.allreduce.main, ["--max-mib", "-1"], "--max-mib=-1 must be ≥ 1"),
    (parallel.bench.dp.main, ["--steps", "0"], "--steps=0 must be ≥ 1"),
    (parallel.bench.pp.main, ["--microbatches", "0"], "--microbatches=0 must be ≥ 1"),
    (parallel.bench.tp.main, ["--warmup", "-1"], "--warmup=-1 must be ≥ 0"),
    (parallel.bench.prune.main, ["--steps", "0"], "--steps=0 must be ≥ 1"),
    (smaller_models_cli.main, ["prune", "--sparsity", "0.5", "1.0"], "--sparsity=1.0 must be in [0, 1)"),
    (smaller_models_cli.main, ["prune", "--finetune-steps", "0"], "--finetune-steps=0 must be ≥ 1"),
    (smaller_models_cli.main, ["distill", "--alpha", "1.5"], "--alpha=1.5 must be in [0, 1]"),
    (smaller_models_cli.main, ["distill", "--temperature", "0"], "--temperature=0.0 must be a finite number > 0"),
    (parallel.bench.zero.main, ["--steps", "0"], "--steps=0 must be ≥ 1"),
    (plan_cli.main, ["--config", "medium", "--devices", "0"], "--devices=0 must be ≥ 1"),
    (plan_cli.main, [*PLAN, "--batch", "0"], "--batch=0 must be ≥ 1"),
    (plan_cli.main, [*PLAN, "--mem-per-device", "0GB"], "--mem-per-device=0 must be ≥ 1"),
    (plan_cli.main, [*PLAN, "--top", "0"], "--top=0 must be ≥ 1"),
    (plan_cli.main, [*PLAN, "--explain", "0"], "--explain=0 must be ≥ 1"),
])
def test_an_out_of_range_flag_is_one_line_and_exit_2(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    assert captured.err.splitlines()[-1].endswith(f"error: {message}")


@pytest.mark.parametrize("content, message", [
    (b"peak_flops: 1e12\n", "is not JSON (Expecting value: line 1 column 1 (char 0))"),
    (b"\xff\xfe", "is not JSON ("),
    (b"[1, 2]", "is not a JSON object of a device's figures"),
])
def test_a_device_file_that_is_not_a_json_profile_is_named(tmp_path, content, message, capsys):
    device = tmp_path / "device.json"
    device.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        plan_cli.main([*PLAN, "--device", str(device)])
    assert exit_info.value.code == 2
    assert f"error: --device {device}: the profile {device} {message}" in capsys.readouterr().err


def test_the_rules_accept_the_edges_and_reject_nan():
    class Args:
        lr, wd, steps, warmup, ranks, unset = 1e-9, 0.0, 1, 0, [1, 2], None
    rules = {"lr": POSITIVE, "wd": NON_NEGATIVE, "steps": AT_LEAST_1, "warmup": AT_LEAST_0, "ranks": AT_LEAST_1,
             "unset": AT_LEAST_1}
    assert bad_flag(Args, rules) is None
    Args.wd = float("nan")
    assert bad_flag(Args, rules) == "--wd=nan must be a finite number ≥ 0"
    Args.wd, Args.lr = 0.0, -0.0
    assert bad_flag(Args, rules) == "--lr=-0.0 must be a finite number > 0"
