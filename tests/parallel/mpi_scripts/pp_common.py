"""Pipeline parallelism against one device: the runs and checks shared by the threads
tests (tests/parallel/pipeline/test_executor.py) and the mpiexec worker
(pp_equivalence.py), so both backends are held to exactly the same checks.

A run trains `steps` AdamW steps, one global batch each. The pipeline cuts a float64
GPT into p·v stages, runs the batch in m micro-batches with the given schedule, and
gathers the dense-named loss, gradients and parameters on every rank; the reference
trains the whole GPT on one device.
"""
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT
from minitensor.optim import AdamW
from parallel.pipeline import check_schedule, get_schedule
from parallel.pipeline.registry import placement_of
from parallel.pipeline.executor import Pipeline

LR, WEIGHT_DECAY = 1e-2, 0.1


def assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12 * max(1.0, float(np.abs(ref).max(initial=0))))


def make_batches(seed, cfg, batch, steps):
    rng = np.random.default_rng(seed)
    shape = (batch, cfg.block_size)
    return [(rng.integers(0, cfg.vocab_size, shape), rng.integers(0, cfg.vocab_size, shape)) for _ in range(steps)]


def make_model(cfg, seed):
    mt.manual_seed(seed)
    return GPT(cfg).double()


def run_single(cfg, seed, batches):
    """Per step: (loss, {name: grad}, {name: param after the step})."""
    model = make_model(cfg, seed)
    opt = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    history = []
    for idx, targets in batches:
        opt.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        opt.step()
        history.append((loss.item(), grads, model.state_dict()))
    return history


def run_pipeline(group, cfg, seed, batches, microbatches, schedule, chunks=1, balance=None, recompute=False):
    """The same steps on this rank's stages; returns (history, peak activations per step)."""
    pipe = Pipeline.from_gpt(make_model(cfg, seed), group, microbatches, schedule, chunks, balance, recompute)
    opt = AdamW(pipe.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)  # each rank steps its own stages
    history, peaks = [], []
    for idx, targets in batches:
        loss = pipe.train_step(idx, targets)
        grads = pipe.full_grads()
        opt.step()
        history.append((loss, grads, pipe.full_state_dict()))
        peaks.append(pipe.peak_activations)
    return history, peaks


def check_against_single(history, ref):
    for (loss, grads, params), (ref_loss, ref_grads, ref_params) in zip(history, ref, strict=True):
        assert_close(loss, ref_loss)
        assert grads.keys() == ref_grads.keys() and params.keys() == ref_params.keys()
        for name in ref_grads:
            assert_close(grads[name], ref_grads[name])
            assert_close(params[name], ref_params[name])


def expected_peaks(schedule, p, m, v):
    """Stored micro-batch activations per rank, as the schedule checker simulates them."""
    return check_schedule(get_schedule(schedule, p, m, v), p, m, v, placement=placement_of(schedule)).peak_activations
