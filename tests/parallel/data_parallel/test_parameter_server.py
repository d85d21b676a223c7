"""The asynchronous parameter server (parallel.data_parallel.parameter_server): s = 0 is synchronous
training; with s > 0 a run under threads (and mpiexec) replays bit for bit in one process."""
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_launch import requires_mpiexec, run_mpi
from mpi_scripts.dp_common import MODELS, SEQ, VOCAB
from strategies import seeds

import minitensor as mt
import parallel
from minitensor.optim import AdamW
from parallel import run_threads
from parallel.data_parallel.parameter_server import run_parameter_server, scripted_delays, simulate, staleness_schedule
from parallel.data_parallel.reducer import Bucket

TIMEOUT = 60
STEPS = 4


def batches(seed, workers, steps):
    rng = np.random.default_rng(seed)
    data = {(w, t): (rng.integers(0, VOCAB, (2, SEQ)), rng.integers(0, VOCAB, (2, SEQ)))
            for t in range(steps) for w in range(workers)}
    return lambda w, t: data[(w, t)]


def fresh(seed):
    mt.manual_seed(seed)
    model = MODELS["tiny"]()
    return model, AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def flat_params(model):
    return Bucket([p for p in model.parameters() if p.requires_grad]).pack_values().copy()


def run(workers, seed, tau, steps=STEPS):
    batch_of = batches(seed, workers, steps)

    def rank_fn():
        model, opt = fresh(seed)
        return run_parameter_server(parallel.world(), model, opt, batch_of, steps, tau)
    return run_threads(workers + 1, rank_fn, timeout=TIMEOUT), batch_of


def test_the_schedule_keeps_the_bound_and_zero_staleness_is_synchronous():
    delays = scripted_delays(3, 3, 10)
    for s in range(4):
        tau = staleness_schedule(delays, s)
        for row in tau:
            assert all(t - s <= v <= t for t, v in enumerate(row)) and row == sorted(row)
        if s == 0:
            assert tau == [list(range(10))] * 3
    assert any(v < t for row in staleness_schedule(delays, 2) for t, v in enumerate(row))  # the slow worker lags
    # no straggler: every version is ready when a worker starts, so none computes on a stale one
    for s in range(4):
        assert staleness_schedule(np.ones((3, 10)), s) == [list(range(10))] * 3


@settings(max_examples=4, deadline=None)
@given(workers=st.integers(1, 3), seed=seeds)
def test_zero_staleness_equals_synchronous_training_on_the_global_batch(workers, seed):
    tau = staleness_schedule(scripted_delays(seed, workers, STEPS), 0)
    results, batch_of = run(workers, seed, tau)
    model, opt = fresh(seed)
    for t in range(STEPS):  # one device on the global batch: the mean of the workers' losses
        opt.zero_grad()
        parts = [batch_of(w, t) for w in range(workers)]
        idx, targets = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        model(idx, targets)[1].backward()
        opt.step()
    assert_close(results[0], flat_params(model))


@pytest.mark.parametrize("staleness", [1, 2])
def test_a_stale_run_replays_bit_for_bit_in_one_process(staleness):
    workers, seed, steps = 3, 5, 6
    tau = staleness_schedule(scripted_delays(seed, workers, steps), staleness)
    assert any(v < t for row in tau for t, v in enumerate(row))
    results, batch_of = run(workers, seed, tau, steps)
    model, opt = fresh(seed)
    np.testing.assert_array_equal(results[0], simulate(model, opt, batch_of, steps, tau))
    again, _ = run(workers, seed, tau, steps)
    np.testing.assert_array_equal(again[0], results[0])
    synchronous = simulate(*fresh(seed), batch_of, steps, staleness_schedule(np.ones((workers, steps)), 0))
    assert not np.array_equal(results[0], synchronous)  # staleness did change the mathematics


def test_a_group_without_workers_is_an_error():
    model, opt = fresh(0)
    with pytest.raises(ValueError, match="needs 1 server \\+ 2 workers, the group has 1 ranks"):
        run_parameter_server(parallel.world(), model, opt, batches(0, 2, 1), 1, [[0], [0]])


@requires_mpiexec
def test_a_stale_run_on_real_ranks_replays_in_one_process():
    result = run_mpi(3, [Path(__file__).parents[1] / "mpi_scripts" / "parameter_server_replay.py"], timeout=120)
    assert result.stdout.count("replayed bit for bit") == 1, result.stdout
