"""Two hosts over a real network on one machine (parallel/bench/_hosts.py: two network
namespaces joined by a veth): the main job's bytes cross TCP, it still equals one device,
a cut cable ends every rank within --timeout naming the operation, and a resume after the
cable is back continues bit for bit.

Root only (network namespaces); elsewhere every test here skips, saying so. Each launch
takes seconds, so they are `deep` tests: .ci/run (as root) runs them after the README's
command, with `pytest -m deep`.
"""
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from parallel.bench._hosts import TwoHosts, can_make_hosts, sh

CANNOT = can_make_hosts()
pytestmark = [pytest.mark.deep, pytest.mark.skipif(
    CANNOT is not None, reason=f"!!! the two-host tests did NOT run: {CANNOT} !!!")]

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2"]
TRAIN = ["-m", "mpi4py", "-m", "parallel.train", *TINY]
GRADIENT_BYTES = 7104 * 8  # the tiny GPT's parameters in float64: one dp all-reduce's buffer


@pytest.fixture
def hosts():
    with TwoHosts() as made:
        yield made
    assert not any(name in sh("ip", "netns", "list").stdout for name in made.names)  # nothing left behind


def check_line(stdout):
    return float(re.search(r"largest relative difference to one device over \d+ step\(s\): (\S+)", stdout).group(1))


def test_multihost_dp2_equals_one_device_and_its_gradients_cross_the_link(hosts):
    before = hosts.bytes_sent()
    run = hosts.mpiexec([*TRAIN, "--steps", "2", "--dp", "2", "--check"], timeout=300)
    assert run.returncode == 0, run.stderr
    assert check_line(run.stdout) <= 1e-9
    sent = {host: count - before[host] for host, count in hosts.bytes_sent().items()}
    # each of 2 ranks must send at least half of each all-reduced gradient: 2 steps, ≥ one buffer each way
    assert all(count >= GRADIENT_BYTES for count in sent.values()), sent


def test_multihost_tensor_parallel_across_the_hosts_equals_one_device(hosts):
    run = hosts.mpiexec([*TRAIN, "--steps", "2", "--tp", "2", "--check"], timeout=300)
    assert run.returncode == 0, run.stderr
    assert check_line(run.stdout) <= 1e-9


def test_multihost_a_cut_cable_ends_every_rank_within_timeout_naming_the_operation(hosts, tmp_path):
    job = hosts.start([*TRAIN, "--steps", "1000000", "--dp", "2", "--timeout", "5", "--log-every", "1",
                       "--log-dir", str(tmp_path)])
    for line in job.stdout:  # until the first step is printed: the job is up and training over the link
        if line.startswith("step"):
            break
    hosts.cut()
    cut = time.monotonic()
    _, stderr = job.communicate(timeout=120)  # 120 s only catches a hang
    ended = time.monotonic() - cut
    assert job.returncode == 1
    # the rank that rank 0's launcher still hears names the operation and where every rank's line is
    assert "timed out on rank 0" in stderr and f"every failing rank's line is in {tmp_path}/rank_*.error" in stderr
    # host B's rank may outlive mpiexec: cut off, it only ends at its own deadline (and writes its line then)
    while sh("ip", "netns", "pids", hosts.names[1]).stdout.split() and time.monotonic() - cut < 120:
        time.sleep(0.2)
    gone = time.monotonic() - cut
    lines = {path.name: path.read_text() for path in sorted(Path(tmp_path).glob("rank_*.error"))}
    assert sorted(lines) == ["rank_00000.error", "rank_00001.error"]  # rank 1's too, though Hydra lost its stderr
    # a step all-reduces its gradients (sum) and agrees on finiteness (max, parallel/train/finite.py): the cut
    # can fall in either, and each rank names the one it was in
    assert all(re.search(r"CommTimeout: all_reduce\(op='(sum|max)'\) timed out", line) for line in lines.values()), lines
    # the deadline (5 s), then rank 1's report delay (5 s) and at most its abort's grace (10 s)
    assert ended < 60 and gone < 60, (ended, gone)


def test_multihost_a_resume_after_the_cable_is_back_continues_bit_for_bit(hosts, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    run = hosts.mpiexec([*TRAIN, "--steps", "4", "--dp", "2", "--save", str(whole), "--save-every", "2"], timeout=300)
    assert run.returncode == 0, run.stderr
    shutil.copytree(whole / "step_000002", halves / "step_000002")  # where a run cut off after step 2 stood
    hosts.cut()
    hosts.restore()
    run = hosts.mpiexec([*TRAIN, "--steps", "4", "--dp", "2", "--resume", str(halves / "step_000002"),
                         "--save", str(halves)], timeout=300)
    assert run.returncode == 0, run.stderr
    for shard in ("rank_00000.npz", "rank_00001.npz"):
        with np.load(whole / "step_000004" / shard) as a, np.load(halves / "step_000004" / shard) as b:
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                assert np.array_equal(a[key], b[key]), (shard, key)
