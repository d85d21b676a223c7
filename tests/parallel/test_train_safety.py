"""`python -m parallel.train` checks its inputs and destinations before the first step, and
stops (on every rank, exit 1) when a save fails or the numbers stop being finite."""
import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

import parallel
from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1"]


def flags(*extra, steps=2):
    return TINY + ["--steps", str(steps), *extra]


def fails(argv, capsys, code=2):
    """main(argv) exits with `code`; returns (its one-line error, what it printed before)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == code, captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith("python -m parallel.train: error: ")
    return captured.err, captured.out


def trained(out):
    return re.findall(r"^step (\d+)/\d+  loss", out, re.M)


def tree(directory):
    """The files of `directory` but a failing run's error lines (rank_NNNNN.error: --log-dir defaults to --save)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*"))
            if p.is_file() and not p.match("rank_*.error")}


# --- item 1: --save never prunes the checkpoint it needs -----------------------------------------

def test_a_shorter_run_into_an_earlier_runs_directory_is_refused_unless_overwrite(tmp_path, capsys):
    main(flags("--save", str(tmp_path), "--save-every", "2", steps=4))
    capsys.readouterr()
    before = tree(tmp_path)
    err, out = fails(flags("--save", str(tmp_path), "--save-every", "1"), capsys)
    assert "already holds checkpoints (step_000002, step_000004)" in err and "--overwrite" in err
    assert trained(out) == [] and tree(tmp_path) == before
    main(flags("--save", str(tmp_path), "--save-every", "1", "--overwrite"))
    assert (f"--overwrite: {tmp_path / 'step_000002'} will be deleted once this run has saved its first checkpoint"
            in capsys.readouterr().out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001", "step_000002"]
    assert (tmp_path / "latest").read_text().strip() == "step_000002"


def test_resuming_a_good_step_beside_a_newer_corrupt_one_keeps_the_good_one(tmp_path, capsys):
    main(flags("--save", str(tmp_path), "--save-every", "1"))
    capsys.readouterr()
    shard = tmp_path / "step_000002" / "rank_00000.npz"
    shard.write_bytes(shard.read_bytes()[:100])  # step 2 is corrupt; latest names it
    good = str(tmp_path / "step_000001")
    err, out = fails(flags("--resume", good, "--save", str(tmp_path), steps=4), capsys)
    assert "holds step_000002, newer than the resumed step 1" in err and trained(out) == []
    assert (tmp_path / "step_000001" / "manifest.json").is_file()
    main(flags("--resume", good, "--save", str(tmp_path), "--overwrite", steps=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001", "step_000004"]
    assert trained(capsys.readouterr().out) == ["2", "3", "4"]


# --- item 3: bad destinations fail before training ------------------------------------------------

def test_bad_destinations_fail_before_the_first_step(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    cases = [
        (["--save", str(a_file)], f"--save {a_file} is a file, not a directory"),
        # unwritable even for root (who may write into a chmod 0o555 directory): the parent is a file
        (["--save", str(a_file / "ckpt")], f"--save: cannot write into {a_file / 'ckpt'}: Not a directory"),
        (["--trace", str(tmp_path / "missing" / "t.json")], f"the directory {tmp_path / 'missing'} does not exist"),
        (["--trace", str(tmp_path)], f"--trace {tmp_path} is a directory"),
    ]
    for extra, message in cases:
        err, out = fails(flags(*extra), capsys)
        assert message in err and trained(out) == [], err


# --- item 4: a failed save stops the run with one line naming the last good checkpoint -------------

def test_a_failed_save_stops_the_run_naming_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    from parallel.checkpoint import save as save_module
    write_shard = save_module.write_shard

    def disk_full_at_step_2(path, *args):
        if "step_000002" in str(path) and parallel.world().rank == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write_shard(path, *args)
    monkeypatch.setattr(save_module, "write_shard", disk_full_at_step_2)
    err, out = fails(flags("--threads", "2", "--dp", "2", "--save", str(tmp_path), "--save-every", "1", steps=3),
                     capsys, code=1)
    assert "saving step_000002 failed on rank 1 (OSError: [Errno 28] No space left on device" in err
    assert f"the last good checkpoint is {tmp_path / 'step_000001'}" in err and trained(out) == ["1", "2"]
    # the failing run's line is kept beside its checkpoints (--log-dir defaults to --save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "rank_00000.error", "step_000001"]


# --- item 5: nothing left to train ---------------------------------------------------------------

def test_resuming_at_or_past_the_last_step_is_an_error(tmp_path, capsys):
    main(flags("--save", str(tmp_path)))
    capsys.readouterr()
    for steps in (2, 1):
        err, out = fails(flags("--resume", str(tmp_path), steps=steps), capsys)
        assert f"is at step 2 and --steps={steps} is the total: nothing left to train" in err and trained(out) == []


# --- item 6: numbers in range, one message form ---------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--lr", "nan"], "--lr=nan must be a finite number > 0"),
    (["--lr", "inf"], "--lr=inf must be a finite number > 0"),
    (["--lr", "0"], "--lr=0.0 must be a finite number > 0"),
    (["--warmup", "-1"], "--warmup=-1 must be ≥ 0"),
    (["--weight-decay", "nan"], "--weight-decay=nan must be a finite number ≥ 0"),
    (["--weight-decay", "-0.1"], "--weight-decay=-0.1 must be a finite number ≥ 0"),
    (["--eval-every", "-1"], "--eval-every=-1 must be ≥ 0"),
    (["--save-every", "-2"], "--save-every=-2 must be ≥ 0"),
    (["--log-every", "-1"], "--log-every=-1 must be ≥ 0"),
    (["--threads", "0"], "--threads=0 must be ≥ 1"),
    (["--threads", "-2"], "--threads=-2 must be ≥ 1"),
    (["--seed", "-1"], "--seed=-1 must be ≥ 0"),
    (["--check", "0"], "--check=0 must be ≥ 1"),
])
def test_hyperparameters_out_of_range_name_the_flag(extra, message, capsys):
    err, out = fails(flags(*extra), capsys)
    assert err == f"python -m parallel.train: error: {message}\n" and out == ""


def test_a_bad_flag_from_the_command_line_is_one_line_and_exit_2():
    run = subprocess.run([sys.executable, "-m", "parallel.train", "--lr", "nan"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert (run.returncode, run.stdout, run.stderr) == (2, "", "python -m parallel.train: error: "
                                                                "--lr=nan must be a finite number > 0\n")


# --- item 7: a non-finite loss or gradient stops every rank ----------------------------------------

@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy reports the overflow on its way to inf
@pytest.mark.parametrize("lr, what", [("1e12", "step 2: the loss is not finite (nan)"),
                                      ("1e6", "step 3: the gradient norm is not finite")])
def test_a_diverging_run_stops_at_the_first_non_finite_step_on_every_rank(lr, what, capsys):
    # no weight decay: with the recipe's decay, lr 1e6 scales the weights by 1 - lr·decay and the
    # loss, not the gradient, is the first value to overflow
    err, out = fails(flags("--threads", "4", "--dp", "2", "--pp", "2", "--lr", lr, "--warmup", "0",
                           "--weight-decay", "0", steps=6),
                     capsys, code=1)
    last = int(what.split()[1][:-1]) - 1
    assert what in err and "the last finite loss was" in err and f"at step {last}; no checkpoint of this run was saved before it)" in err
    assert trained(out) == [str(s) for s in range(1, last + 1)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_run_stopped_by_a_non_finite_step_writes_its_line_into_the_log_dir(tmp_path, capsys):
    """--help: every failing rank writes its line to DIR/rank_NNNNN.error; a stopped run is one."""
    err, _ = fails(flags("--lr", "1e12", "--warmup", "0", "--log-dir", str(tmp_path), steps=4), capsys, code=1)
    line = (tmp_path / "rank_00000.error").read_text().strip()
    assert "step 2: the loss is not finite (nan)" in line and err.strip() == (
        f"{line} (every failing rank's line is in {tmp_path}/rank_*.error)")


def test_a_log_dir_that_cannot_be_made_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    err, out = fails(flags("--log-dir", str(tmp_path / "file" / "logs")), capsys)
    assert err.strip().endswith(f"--log-dir {tmp_path / 'file' / 'logs'}: {tmp_path / 'file'} is a file, so no "
                                "directory can be made there") and not trained(out)


@requires_mpiexec
def test_a_diverging_run_under_mpiexec_ends_every_rank_with_exit_1():
    """Real processes: every rank sees the flag (MAX all-reduce), so none waits in the next
    collective; the job ends (about a second on a quiet machine; 60 s only catches a hang),
    and the message every rank agrees on is printed once, by rank 0."""
    result = run_mpi(4, ["-m", "parallel.train", *flags("--dp", "2", "--pp", "2", "--lr", "1e12", "--warmup", "0",
                                                         steps=6)], timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    stops = re.findall(r"^python -m parallel.train: error: rank (\d): step 2: the loss is not finite \(nan\)",
                       result.stderr, re.M)
    assert stops == ["0"]


# --- item 9: --data that is not UTF-8 -------------------------------------------------------------

def test_data_that_is_not_utf8_names_the_flag_and_the_file(tmp_path, capsys):
    data = tmp_path / "latin1.txt"
    data.write_bytes("caf\xe9 au lait ".encode("latin-1") * 20)
    err, _ = fails(["--data", str(data), "--block-size", "8"], capsys)
    assert f"--data {data} is not UTF-8 text: byte 0xe9 at offset 3" in err
