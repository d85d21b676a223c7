"""How `python -m parallel.train` fails: one line naming the rank, no traceback for user errors (--debug
shows it), a traceback for bugs, and the whole job ends with a non-zero status — on threads and on
real MPI ranks launched without `-m mpi4py`; --timeout ends a job whose rank stops answering; the
README's multi-machine launch line (mpiexec -f HOSTFILE) runs here through a hostfile of localhost."""
import os
import sys
import threading
from pathlib import Path

import pytest
from mpi_launch import MPIEXEC, requires_mpiexec, run_command

import parallel.train.loop as loop
from parallel.comm import CommTimeout
from parallel.train import main
from parallel.train.errors import run_job

SCRIPTS = Path(__file__).parent / "mpi_scripts"
TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "1", "--batch", "8", "--digits", "2", "--steps", "1"]
ERROR = "python -m parallel.train: error: "


def failing_main(exc):
    def fail(argv):
        raise exc
    return fail


def error_lines(text):
    return [line for line in text.splitlines() if ERROR in line]


def test_a_user_error_is_one_line_without_traceback_and_exit_status_1(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_job(failing_main(ValueError("--lr -1 must be positive")))
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == f"{ERROR}ValueError: --lr -1 must be positive\n"


def test_a_bug_shows_its_traceback_then_the_line(capsys):
    with pytest.raises(SystemExit):
        run_job(failing_main(KeyError("wte.weight")))
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.endswith(f"{ERROR}KeyError: 'wte.weight'\n")


@pytest.mark.parametrize("debug", [False, True])
def test_a_threads_job_names_the_failed_rank_and_debug_adds_the_traceback(debug, tmp_path, capsys, monkeypatch):
    path = tmp_path / "file"

    def evaluate_fails(model, task):  # the evaluation runs on rank 0 only, while rank 1 waits
        raise FileExistsError(17, "File exists", str(path))
    monkeypatch.setattr(loop, "evaluate", evaluate_fails)
    argv = TINY + ["--threads", "2", "--dp", "2"] + ["--debug"] * debug
    with pytest.raises(SystemExit):
        run_job(main, argv)
    err = capsys.readouterr().err
    assert error_lines(err) == [f"{ERROR}FileExistsError: [Errno 17] File exists: '{path}' "
                                f"(raised on rank 0 of run_threads(world_size=2))"]
    assert ("Traceback" in err) == debug


def test_timeout_ends_a_threads_job_whose_rank_stops_answering(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(loop, "evaluate", lambda model, task: release.wait(30))  # rank 0, while rank 1 trains on
    try:
        with pytest.raises(CommTimeout) as info:
            main(TINY[:-2] + ["--steps", "2", "--eval-every", "1", "--threads", "2", "--dp", "2", "--timeout", "0.5"])
    finally:
        release.set()
    message = str(info.value)
    assert "timed out on rank 1 of the group of 2 rank(s) with world ranks [0, 1] after " in message, message
    assert message.endswith("(timeout=0.5 s): rank(s) [0] of this group (world ranks [0]) have not called all_reduce")


def test_a_timeout_that_is_not_a_positive_number_is_a_flag_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--timeout", "0"])
    assert exit_info.value.code == 2
    assert "argument --timeout: invalid seconds value: '0'" in capsys.readouterr().err


# --- real MPI ranks, launched as `mpiexec -n N python -m parallel.train` (no `-m mpi4py`) ---------------


def mpiexec(*args, timeout=60):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return run_command([MPIEXEC, *args], timeout=timeout, check=False, env=env)


@requires_mpiexec
def test_an_error_on_one_mpi_rank_is_one_line_and_ends_the_job(tmp_path):
    """Rank 0 fails inside training while rank 1 waits for it in a collective (no -m mpi4py)."""
    path = tmp_path / "file"
    result = mpiexec("-n", "2", sys.executable, SCRIPTS / "train_rank0_fails.py", path, *TINY, "--dp", "2")
    assert result.returncode == 1, result.stderr
    assert error_lines(result.stderr) == [f"{ERROR}rank 0 of 2: FileExistsError: [Errno 17] File exists: '{path}'"]
    assert "Traceback" not in result.stderr


@requires_mpiexec
def test_a_failing_rank_writes_its_line_into_the_log_dir_and_says_so(tmp_path):
    """A rank cut off from the launcher loses its stderr (Hydra carries it), not this file."""
    path, logs = tmp_path / "file", tmp_path / "logs"
    result = mpiexec("-n", "2", sys.executable, SCRIPTS / "train_rank0_fails.py", path, *TINY, "--dp", "2",
                     "--log-dir", logs)
    line = f"{ERROR}rank 0 of 2: FileExistsError: [Errno 17] File exists: '{path}'"
    assert result.returncode == 1
    assert error_lines(result.stderr) == [f"{line} (every failing rank's line is in {logs}/rank_*.error)"]
    assert (logs / "rank_00000.error").read_text() == line + "\n"


@requires_mpiexec
@pytest.mark.parametrize("where", ["a flag", "the save"])
def test_an_error_on_every_mpi_rank_is_printed_once(where, tmp_path):
    if where == "a flag":  # checked before any work, alike on every rank
        save = tmp_path / "file"
        save.write_text("")
        status, expected = 2, f"{ERROR}rank 0: --save {save} is a file, not a directory"
    else:  # every rank finds the step's directory already there
        save = tmp_path
        (save / "step_000001").mkdir()
        status, expected = 1, (f"{ERROR}rank 0: checkpoint {save / 'step_000001'} already "
                               f"exists; save step 1 elsewhere or remove it (every failing rank's line is in "
                               f"{save}/rank_*.error)")
    result = mpiexec("-n", "2", sys.executable, "-m", "parallel.train", *TINY, "--dp", "2", "--save", save)
    assert result.returncode == status, result.stderr
    assert error_lines(result.stderr) == [expected], result.stderr
    assert "Traceback" not in result.stderr
    if where == "the save":  # every rank failed alike, and each kept its line
        assert sorted(p.name for p in save.glob("rank_*.error")) == ["rank_00000.error", "rank_00001.error"]


@requires_mpiexec
def test_the_readme_hostfile_launch_runs_on_localhost(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    result = mpiexec("-f", hosts, "-n", "2", sys.executable, "-m", "parallel.train", *TINY, "--dp", "2",
                     "--timeout", "600")
    assert result.returncode == 0, result.stderr
    assert "parallel: 2 rank(s) on the mpi backend" in result.stdout
    assert "held-out exact match:" in result.stdout
