"""`python -m parallel.bench network`'s arithmetic (the fit of α and β, the step time it reads)
and its refusal without root; the measurement itself needs root (the multihost tests)."""
import subprocess

import numpy as np
import pytest

from parallel.bench import network


def test_the_fit_recovers_alpha_and_beta_and_never_gives_a_negative_alpha():
    sizes = network.SIZES
    alpha, beta = network.fit(sizes, [50e-6 + 8e-9 * n for n in sizes])
    assert alpha == pytest.approx(50e-6, rel=1e-6) and beta == pytest.approx(8e-9, rel=1e-9)
    # a token bucket's burst lets small messages through early: the line would cross below zero
    alpha, beta = network.fit(sizes, [max(1e-6, 80e-9 * n - 2e-3) for n in sizes])
    assert alpha == 0.0 and beta == pytest.approx(np.dot(sizes, [max(1e-6, 80e-9 * n - 2e-3) for n in sizes])
                                                  / np.dot(sizes, sizes))


def test_the_step_time_is_read_from_the_jobs_last_line():
    run = subprocess.CompletedProcess([], 0, "step 40/40  loss 1.0\ntrained 40 steps in 0:02 (2.40 s)\n", "")
    assert network.step_seconds(run) == pytest.approx(0.06)
    with pytest.raises(RuntimeError, match="the training job failed"):
        network.step_seconds(subprocess.CompletedProcess([], 1, "", "boom"))


def test_without_root_it_says_why_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(network, "can_make_hosts", lambda: "making network namespaces needs root (this process is not)")
    assert network.main([]) == 2
    assert "needs root" in capsys.readouterr().err
