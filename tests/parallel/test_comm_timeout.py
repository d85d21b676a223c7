"""Deadlines and debug checks: a stuck or stopped rank ends the job with a message naming the operation,
the group and (where the backend can know) the missing ranks; PARALLEL_DEBUG=1 makes MPI report
mismatched collectives. Threads in-process; MPI under real mpiexec (a rank stopped with SIGSTOP)."""
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_launch import requires_mpiexec, run_mpi

import parallel
from parallel.comm import CommTimeout
from parallel.comm.threads import single_rank_group

SCRIPTS = Path(__file__).parent / "mpi_scripts"
TIMEOUT = 20  # seconds: a bound on every run_threads call, so a bug fails instead of hanging


def stuck_while_others_wait(stuck_rank, wait, split=False):
    """Run on 4 threads with a 0.5 s deadline: world rank `stuck_rank` is busy elsewhere (not
    communicating) until released; the others run wait(group), group being the world or, if
    `split`, the half of it with the same rank parity. Returns the CommTimeout's message."""
    release = threading.Event()

    def rank_fn():
        group = parallel.world(timeout=0.5)
        stuck = group.rank == stuck_rank
        if split:
            group = group.split(group.rank % 2)
        if stuck:
            release.wait(TIMEOUT)
        wait(group)
    try:
        with pytest.raises(CommTimeout) as info:
            parallel.run_threads(4, rank_fn, timeout=TIMEOUT)
    finally:
        release.set()
    return str(info.value)


def test_a_rank_stuck_in_compute_times_out_the_collective_naming_the_missing_rank():
    message = stuck_while_others_wait(2, lambda g: g.all_reduce(np.ones(3)))
    assert re.fullmatch(r"all_reduce\(op='sum'\) timed out on rank [013] of the group of 4 rank\(s\) with world "
                        r"ranks \[0, 1, 2, 3\] after \d+\.\d s \(timeout=0.5 s\): rank\(s\) \[2\] of this group "
                        r"\(world ranks \[2\]\) have not called all_reduce", message), message


def test_a_split_group_inherits_the_deadline_and_names_its_members_by_world_rank():
    message = stuck_while_others_wait(3, lambda g: g.broadcast(np.ones(2), root=0), split=True)
    assert message.startswith("broadcast(root=0) timed out on rank 0 of the group of 2 rank(s) with world ranks "
                              "[1, 3] after "), message
    assert message.endswith("(timeout=0.5 s): rank(s) [1] of this group (world ranks [3]) have not called broadcast")


def test_a_receive_from_a_stuck_rank_times_out_naming_it():
    def wait(group):
        if group.rank == 0:
            group.recv(np.ones(2), src=1, tag=3)
    message = stuck_while_others_wait(1, wait)
    assert message.startswith("recv(src=1, tag=3) timed out on rank 0 of the group of 4 rank(s)"), message
    assert message.endswith(": rank 1 has not sent the message (tag 3)")


def test_the_deadline_comes_from_parallel_timeout_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv("PARALLEL_TIMEOUT", "7.5")
    assert parallel.run_threads(2, lambda: parallel.world().split(0).timeout, timeout=TIMEOUT) == [7.5, 7.5]
    with pytest.raises(ValueError, match=r"timeout=-1 must be a positive number of seconds"):
        parallel.world(timeout=-1)
    monkeypatch.setenv("PARALLEL_TIMEOUT", "soon")
    group = single_rank_group()  # the variable is read when a group's deadline is first needed
    with pytest.raises(ValueError, match=r"PARALLEL_TIMEOUT='soon' must be a positive number of seconds"):
        group.timeout
    # a deadline given explicitly (a program's --timeout) wins: the variable is never read
    assert parallel.run_threads(1, lambda: parallel.world(timeout=5).timeout, timeout=TIMEOUT) == [5.0]


# --- MPI: real ranks, one stopped with SIGSTOP ------------------------------------------------------


def assert_stopped_rank_is_gone(stdout):
    """The stopped rank printed its pid; MPI_Abort must have killed it (a stopped process ignores
    everything but SIGKILL). If it is still there, kill it and fail."""
    pid = int(re.search(r"stops itself: pid (\d+)", stdout).group(1))
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    pytest.fail(f"the stopped rank (pid {pid}) outlived the job")


@requires_mpiexec
def test_a_stopped_mpi_rank_ends_the_job_when_the_collective_deadline_passes():
    result = run_mpi(3, [SCRIPTS / "stuck_rank.py", "all_reduce"], timeout=60, check=False)
    assert result.returncode != 0
    assert re.search(r"CommTimeout: all_reduce\(op='sum'\) timed out on rank [01] of the group of 3 rank\(s\) with "
                     r"world ranks \[0, 1, 2\] after 3\.\d s \(timeout=3 s\): MPI does not tell a waiting rank which "
                     r"ranks have not joined a collective", result.stderr), result.stderr
    assert_stopped_rank_is_gone(result.stdout)


@requires_mpiexec
def test_a_receive_from_a_stopped_mpi_rank_times_out_naming_the_sender():
    result = run_mpi(2, [SCRIPTS / "stuck_rank.py", "recv"], timeout=60, check=False)
    assert result.returncode != 0
    assert re.search(r"CommTimeout: recv\(src=1, tag=5\) timed out on rank 0 of the group of 2 rank\(s\) with world "
                     r"ranks \[0, 1\] after 3\.\d s \(timeout=3 s\): rank 1 has not sent the message \(tag 5\)",
                     result.stderr), result.stderr
    assert_stopped_rank_is_gone(result.stdout)


@requires_mpiexec
@pytest.mark.parametrize("mode, message", [
    ("kind", "ValueError: collective mismatch in a group of size 2: rank 0 called all_reduce, rank 1 called broadcast"),
    ("shape", ("ValueError: all_gather called with different arguments across ranks: "
               "rank 0: {'dtype': 'float64', 'shape': (2,)}; rank 1: {'dtype': 'float64', 'shape': (3,)}")),
])
def test_parallel_debug_reports_mismatched_mpi_collectives(mode, message, monkeypatch):
    monkeypatch.setenv("PARALLEL_DEBUG", "1")
    result = run_mpi(2, [SCRIPTS / "mismatch.py", mode], timeout=60, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("program, prog, hint", [
    (["allreduce"], "python -m parallel.bench allreduce", "fix it, or unset it for the default"),
    (["moe"], "python -m parallel.bench moe", "fix it, or unset it for the default"),
    (["--calibrate", "--output", "{tmp}/p.json"], "python -m parallel.plan", "fix it, or unset it for the default"),
    (["--steps", "1"], "python -m parallel.train", "fix it, or pass --timeout SECONDS, which wins over it"),
])
def test_a_bad_parallel_timeout_is_every_programs_one_line_error(program, prog, hint, tmp_path, monkeypatch, capsys):
    """As a bad flag: exit 2, one line naming the variable, before any work (the benches gave tracebacks)."""
    from parallel.bench.__main__ import main as bench
    from parallel.plan.__main__ import main as plan
    from parallel.train.cli import main as train
    monkeypatch.setenv("PARALLEL_TIMEOUT", "abc")
    run = {"bench": bench, "plan": plan, "train": train}[prog.split()[2].split(".")[1]]
    try:
        code = run([a.format(tmp=tmp_path) for a in program])
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err  # parallel.plan prints its usage first, as for a bad flag
    assert err.splitlines()[-1] == f"{prog}: error: PARALLEL_TIMEOUT='abc' must be a positive number of seconds; {hint}"
