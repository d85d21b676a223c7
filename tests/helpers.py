"""Numeric helpers shared by the tests (append new ones at the end)."""
import numpy as np

import minitensor as mt


def leaf(rng, shape, transposed=False, positive=False, requires_grad=True):
    """A float64 leaf tensor of standard-normal values (ties and kinks have probability 0).

    `positive` moves values into [0.5, ∞) for log/sqrt/div; `transposed` stores the same
    values in Fortran order, so ops see a non-contiguous array.
    """
    data = np.asarray(rng.standard_normal(shape))
    if positive:
        data = np.abs(data) + 0.5
    if transposed:
        data = data.T.copy().T  # (np.asfortranarray would make a 0-d array 1-d)
    return mt.Tensor(data, requires_grad=requires_grad)


def away_from_zero(t, margin=0.1):
    """Push values at least `margin` away from 0 (for relu's kink), in place."""
    t.data[...] = np.where(t.data >= 0, t.data + margin, t.data - margin)
    return t


def assert_close(got, ref, err_msg=""):
    """Float64 equality to the single-device result: 1e-9 relative, atol scaled by the reference."""
    ref = np.asarray(ref)
    atol = 1e-12 * max(1.0, float(np.abs(ref).max())) if ref.size else 0.0
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-9, atol=atol, err_msg=err_msg)


def train_history(model, data, accumulate):
    """A parallel model (parallel.ParallelModel) stepped once per `accumulate` batches of `data`;
    per step: (mean loss, {name: gradient}, {name: parameter after the step}), the whole model's
    on every rank, to hold against one device's."""
    history = []
    for start in range(0, len(data), accumulate):
        losses = [model.train_step(idx, targets) for idx, targets in data[start:start + accumulate]]
        grads = model.full_grads()
        model.optimizer_step()
        history.append((float(np.mean(losses)), grads, model.full_state_dict()))
    return history
