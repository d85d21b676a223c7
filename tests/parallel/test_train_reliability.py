"""`python -m parallel.train` never saves numbers that are not finite, deletes nothing before
it has something better, and ends every bad input in one line: exit 2 before any work, 1
during it (issue 29's second round of hostile inputs)."""
import os
import subprocess
import sys

import pytest
from test_train_safety import fails, flags, trained, tree

import parallel.train.task
from parallel.train import main

DIVERGES = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy reports the overflow on its way to inf


def saved(directory):
    """What is in `directory` but a failing run's error lines (rank_NNNNN.error: --log-dir defaults to --save)."""
    return sorted(p.name for p in directory.iterdir() if not p.match("rank_*.error")) if directory.exists() else []


# --- non-finite weights are never saved, and the message names the update and the last good one ---

def test_a_learning_rate_that_overflows_the_training_dtype_is_refused(capsys):
    err, _ = fails(flags("--lr", "1e39"), capsys)
    assert "--lr=1e+39 is out of range for the training dtype float32 (largest 3.4e+38)" in err


@DIVERGES
def test_an_optimizer_step_that_makes_the_weights_inf_is_neither_saved_nor_latest(tmp_path, capsys):
    # 1 − lr·λ = 1 − 1e39 is -inf in float32: the loss and gradient of step 1 were finite
    err, out = fails(flags("--lr", "1e38", "--weight-decay", "10", "--warmup", "0", "--save", str(tmp_path),
                           "--save-every", "1"), capsys, code=1)
    assert "step 1: the optimizer step made a weight or an AdamW moment inf or nan; try a smaller --lr" in err
    assert "nothing of step 1 was saved; no checkpoint of this run was saved before it" in err
    assert trained(out) == [] and saved(tmp_path) == []


@DIVERGES
def test_an_outer_step_that_diverges_names_outer_lr_and_the_last_good_checkpoint(tmp_path, capsys):
    err, out = fails(flags("--threads", "2", "--dp", "2", "--local-steps", "2", "--lr", "10", "--warmup", "0",
                           "--outer-lr", "3e38", "--save", str(tmp_path), "--save-every", "1", steps=4),
                     capsys, code=1)
    assert "step 2: DiLoCo's outer step made a weight or its momentum inf or nan; try a smaller --outer-lr" in err
    assert f"the last good checkpoint is {tmp_path / 'step_000001'}" in err
    assert saved(tmp_path) == ["latest", "step_000001"] and (tmp_path / "latest").read_text() == "step_000001\n"


@DIVERGES
def test_a_loss_that_diverges_right_after_an_outer_step_names_outer_lr(capsys):
    # the outer step's weights are huge but finite; the next forward overflows
    err, _ = fails(flags("--threads", "2", "--dp", "2", "--local-steps", "2", "--outer-lr", "3e38", steps=4),
                   capsys, code=1)
    assert "step 3: the loss is not finite" in err and "DiLoCo's outer step just before: try a smaller --outer-lr" in err


@pytest.mark.parametrize("extra, message", [
    (["--outer-lr", "inf"], "--outer-lr=inf must be a finite number > 0"),
    (["--outer-lr", "nan"], "--outer-lr=nan must be a finite number > 0"),
    (["--outer-lr", "-1"], "--outer-lr=-1.0 must be a finite number > 0"),
    (["--outer-momentum", "1"], "--outer-momentum=1.0 must be a finite number in [0, 1)"),
    (["--outer-momentum", "nan"], "--outer-momentum=nan must be a finite number in [0, 1)"),
    (["--outer-momentum", "-0.5"], "--outer-momentum=-0.5 must be a finite number in [0, 1)"),
    (["--local-steps", "0"], "--local-steps=0 must be ≥ 1"),
    (["--outer-lr", "1e39"], "--outer-lr=1e+39 is out of range for the training dtype float32"),
])
def test_every_float_flag_is_checked_in_one_form(extra, message, capsys):
    err, _ = fails(flags("--threads", "2", "--dp", "2", "--local-steps", "2", *extra), capsys)
    assert message in err


def test_an_async_staleness_below_zero_is_refused_in_the_same_form(capsys):
    err, _ = fails(flags("--threads", "3", "--dp", "2", "--async-staleness", "-1"), capsys)
    assert "--async-staleness=-1 must be ≥ 0" in err


# --- --overwrite: validate first, delete only after a newer good checkpoint ------------------------

def test_overwrite_with_a_checkpoint_of_another_model_deletes_nothing(tmp_path, capsys):
    main(flags("--save", str(tmp_path), "--save-every", "1", steps=3))
    capsys.readouterr()
    before = tree(tmp_path)
    err, out = fails(flags("--resume", str(tmp_path / "step_000002"), "--save", str(tmp_path), "--overwrite",
                           "--d-model", "32", steps=4), capsys)
    assert "is of another model: d_model: checkpoint 16, model 32" in err and trained(out) == []
    assert tree(tmp_path) == before


@DIVERGES
def test_overwrite_deletes_the_newer_checkpoints_only_once_this_run_has_saved(tmp_path, capsys):
    main(flags("--save", str(tmp_path), "--save-every", "1", steps=3))
    capsys.readouterr()
    before = tree(tmp_path)
    # a run that fails before its first save leaves them all
    err, out = fails(flags("--save", str(tmp_path), "--overwrite", "--lr", "1e38", "--weight-decay", "10", "--warmup",
                           "0"), capsys, code=1)
    assert "step 1: the optimizer step made a weight" in err and tree(tmp_path) == before
    main(flags("--resume", str(tmp_path / "step_000002"), "--save", str(tmp_path), "--overwrite", steps=4))
    out = capsys.readouterr().out
    assert f"--overwrite: {tmp_path / 'step_000003'} will be deleted once this run has saved" in out
    assert saved(tmp_path) == ["latest", "step_000002", "step_000004"]


def test_overwrite_replaces_a_step_of_the_same_number_only_after_writing_it(tmp_path, capsys):
    main(flags("--save", str(tmp_path), "--save-every", "1", "--seed", "1", steps=3))
    old = (tmp_path / "step_000002" / "rank_00000.npz").read_bytes()
    main(flags("--save", str(tmp_path), "--overwrite"))  # its first save is step 2
    capsys.readouterr()
    assert saved(tmp_path) == ["latest", "step_000002"]
    assert (tmp_path / "step_000002" / "rank_00000.npz").read_bytes() != old


# --- resuming: the checkpoint is checked against the run before anything is built ----------------

def test_resuming_a_float32_checkpoint_as_float64_is_refused_before_building(tmp_path, capsys):
    main(flags("--save", str(tmp_path), steps=1))
    capsys.readouterr()
    err, out = fails(flags("--resume", str(tmp_path), "--dtype", "float64"), capsys)
    assert "holds float32 parameters, but this run's are float64: pass --dtype float32" in err and out == ""


def test_a_local_sgd_checkpoint_resumes_only_with_its_own_local_steps(tmp_path, capsys):
    main(flags("--threads", "2", "--dp", "2", "--local-steps", "3", "--save", str(tmp_path), steps=2))
    capsys.readouterr()
    for given, named in ((["--local-steps", "2"], "--local-steps 2"), ([], "no --local-steps")):
        err, out = fails(flags("--threads", "2", "--dp", "2", "--resume", str(tmp_path), *given, steps=4), capsys)
        assert f"saved by local SGD with --local-steps 3, and this run has {named}" in err and out == ""


def test_a_change_of_precision_on_resume_is_one_notice(tmp_path, capsys):
    main(flags("--save", str(tmp_path), steps=1))
    capsys.readouterr()
    main(flags("--resume", str(tmp_path), "--precision", "fp16", steps=2))
    out = capsys.readouterr().out
    assert out.count(f"note: --resume {tmp_path} was trained under --precision fp32; this run continues under "
                     f"fp16") == 1 and trained(out) == ["2"]


# --- inputs that gave a traceback or the wrong hint -----------------------------------------------

def test_a_bad_parallel_timeout_is_one_line_and_the_flag_wins(monkeypatch, capsys):
    monkeypatch.setenv("PARALLEL_TIMEOUT", "0")
    err, _ = fails(flags(), capsys)
    assert "PARALLEL_TIMEOUT='0' must be a positive number of seconds; fix it, or pass --timeout SECONDS" in err
    assert trained(main(flags("--timeout", "5")) and capsys.readouterr().out) == ["1", "2"]


def test_a_bad_parallel_timeout_from_the_command_line_is_exit_2_without_traceback():
    run = subprocess.run([sys.executable, "-m", "parallel.train", *flags()], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PARALLEL_TIMEOUT="0", OPENBLAS_NUM_THREADS="1"))
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1


@pytest.mark.parametrize("data", ["/dev/zero", "a directory"])
def test_data_that_is_not_a_regular_file_is_refused(data, tmp_path, capsys):
    path = str(tmp_path) if data == "a directory" else data
    err, _ = fails(flags("--data", path), capsys)
    assert f"--data {path} is not a regular file" in err


def test_data_larger_than_the_bound_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(parallel.train.task, "MAX_DATA_BYTES", 1 << 20)
    text = tmp_path / "big.txt"
    text.write_text("a" * ((1 << 20) + 1))
    err, _ = fails(flags("--data", str(text)), capsys)
    assert f"--data {text} has 1,048,577 bytes, more than the 1 MiB" in err


def test_the_context_parallel_length_hint_on_data_names_block_size(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("some text to train on, long enough for a block.\n" * 20)
    err, _ = fails(["--data", str(text), "--threads", "2", "--cp", "2", "--block-size", "30", "--steps", "1"], capsys)
    assert "on --data the length is --block-size" in err and "--digits" not in err


def test_a_negative_link_says_to_attach_the_value_then_why_it_is_wrong(capsys):
    with pytest.raises(SystemExit):
        main(flags("--link", "-1,1e-9"))
    assert "(a value starting with '-' must be attached: --link=-1,1e-9)" in capsys.readouterr().err
    err, _ = fails(flags("--link=-1,1e-9"), capsys)
    assert "alpha=-1.0 s" in err and "a link cannot take negative time" in err
