"""Local SGD / DiLoCo (parallel.data_parallel.local_sgd) against its exact references (threads backend):
H = 1 with outer lr 1 and no momentum is synchronous data parallelism; any H is a
sequential simulation of n replicas in one process; bytes per optimizer step fall by H.
Checkpoints between outer steps resume bitwise (threads here and in test_train_comm.py,
one mpiexec job), only where they can."""
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_launch import requires_mpiexec, run_mpi
from mpi_scripts.ckpt_common import hybrid, train
from mpi_scripts.dp_common import MODELS, make_data, micro_batches
from strategies import seeds

import minitensor as mt
import parallel
from minitensor.optim import SGD, AdamW
from parallel import run_threads
from parallel.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from parallel.data_parallel.local_sgd import DiLoCo
from parallel.data_parallel.reducer import Reducer

TIMEOUT = 60
INNER_LR = 0.05


def params_of(model):
    return [p for p in model.parameters() if p.requires_grad]


def run_local_sgd(group, seed, data, inner, local_steps, outer_lr, outer_momentum):
    """DiLoCo on this rank: `inner` (SGD or AdamW) on the rank's rows, the outer step over `group`."""
    mt.manual_seed(seed)  # the replicas start as one model
    model = MODELS["tiny"]()
    opt = inner(model.parameters(), lr=INNER_LR)
    outer = DiLoCo(Reducer(params_of(model)[::-1], group), local_steps, outer_lr, outer_momentum)
    group.reset_stats()
    bytes_per_step = []
    for batch in data:
        opt.zero_grad()
        (idx, targets), = micro_batches(batch, group.rank, group.size, 1)
        model(idx, targets)[1].backward()
        opt.step()
        outer.step()
        bytes_per_step.append(group.stats().get("all_reduce", {}).get("bytes", 0))
    return model.state_dict(), np.diff([0] + bytes_per_step)


def run_sync_sgd(seed, data):
    """Synchronous data parallelism with SGD, on one device: the global batch's gradient."""
    mt.manual_seed(seed)
    model = MODELS["tiny"]()
    opt = SGD(model.parameters(), lr=INNER_LR)
    for idx, targets in data:
        opt.zero_grad()
        model(idx, targets)[1].backward()
        opt.step()
    return model.state_dict()


def simulate_diloco(seed, data, n, local_steps, outer_lr, outer_momentum):
    """n replicas trained one after another in one process, each with its own AdamW, averaged
    every `local_steps` steps by Nesterov SGD written out here (PyTorch's form)."""
    replicas = []
    for _ in range(n):
        mt.manual_seed(seed)
        model = MODELS["tiny"]()
        replicas.append((model, AdamW(model.parameters(), lr=INNER_LR)))
    anchor = [p.data.copy() for p in params_of(replicas[0][0])]
    velocity = [np.zeros_like(a) for a in anchor]
    for step, batch in enumerate(data, start=1):
        for rank, (model, opt) in enumerate(replicas):
            opt.zero_grad()
            (idx, targets), = micro_batches(batch, rank, n, 1)
            model(idx, targets)[1].backward()
            opt.step()
        if step % local_steps == 0:
            for j in range(len(anchor)):
                delta = np.mean([anchor[j] - params_of(model)[j].data for model, _ in replicas], axis=0)
                velocity[j] = outer_momentum * velocity[j] + delta
                anchor[j] = anchor[j] - outer_lr * (delta + outer_momentum * velocity[j])
                for model, _ in replicas:
                    params_of(model)[j].data[...] = anchor[j]
    return [model.state_dict() for model, _ in replicas]


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 4), seed=seeds)
def test_one_local_step_with_outer_lr_one_and_no_momentum_is_synchronous_sgd(n, seed):
    data = make_data(seed, n, 1, 2, 3)
    ref = run_sync_sgd(seed, data)
    for final, _ in run_threads(n, lambda: run_local_sgd(parallel.world(), seed, data, SGD, 1, 1.0, 0.0),
                                timeout=TIMEOUT):
        for name, value in ref.items():
            assert_close(final[name], value, err_msg=name)


@settings(max_examples=6, deadline=None)
@given(n=st.integers(2, 4), local_steps=st.integers(1, 3), momentum=st.sampled_from([0.0, 0.9]), seed=seeds)
def test_diloco_equals_a_sequential_simulation_of_the_replicas(n, local_steps, momentum, seed):
    data = make_data(seed, n, 1, 2, 2 * local_steps + 1)  # ends one step after a sync: replicas differ
    ref = simulate_diloco(seed, data, n, local_steps, 0.7, momentum)
    for rank, (final, _) in enumerate(run_threads(
            n, lambda: run_local_sgd(parallel.world(), seed, data, AdamW, local_steps, 0.7, momentum),
            timeout=TIMEOUT)):
        for name, value in ref[rank].items():
            assert_close(final[name], value, err_msg=f"rank {rank} {name}")


@pytest.mark.parametrize("local_steps", [1, 2, 4])
def test_bytes_per_optimizer_step_fall_by_the_local_steps(local_steps):
    n, steps = 2, 8
    data = make_data(0, n, 1, 2, steps)
    _, per_step = run_threads(n, lambda: run_local_sgd(parallel.world(), 0, data, AdamW, local_steps, 0.7, 0.9),
                              timeout=TIMEOUT)[0]
    numel = sum(p.size for p in params_of(MODELS["tiny"]()))
    one_all_reduce = 2 * (n - 1) * numel * 8 // n
    assert list(per_step) == [one_all_reduce if step % local_steps == 0 else 0 for step in range(1, steps + 1)]
    assert per_step.sum() == steps // local_steps * one_all_reduce


def test_bad_local_steps_and_outer_figures_are_named():
    reducer = Reducer(params_of(MODELS["tiny"]()), parallel.world())
    with pytest.raises(ValueError, match="local_steps=0 must be an int ≥ 1"):
        DiLoCo(reducer, 0)
    with pytest.raises(ValueError, match=r"outer_momentum=1.0 must be in \[0, 1\)"):
        DiLoCo(reducer, 2, outer_momentum=1.0)
    with pytest.raises(ValueError, match="outer_lr=0 must be > 0"):
        DiLoCo(reducer, 2, outer_lr=0)
    assert DiLoCo(reducer, 2).outer_lr == pytest.approx(0.1)  # 1 − μ: a stride of 1


# --- checkpoints ---------------------------------------------------------------------------

CKPT_WORKER = Path(__file__).parents[1] / "mpi_scripts" / "ckpt_train.py"


def local_sgd_model(layout, local_steps=3):
    model = hybrid(*layout)
    model.configure_local_sgd(local_steps)
    return model


def save_local_sgd(directory, layout, steps):
    def body():
        model = local_sgd_model(layout)
        train(model, range(steps))
        save_checkpoint(directory, model, step=steps)
    run_threads(layout[0] * layout[1] * layout[2], body, timeout=TIMEOUT)


@requires_mpiexec
def test_local_sgd_saved_between_outer_steps_resumes_bitwise_under_mpiexec(tmp_path):
    """H = 3, saved after 4 steps (after one outer step, in the middle of the next period)."""
    common = [CKPT_WORKER, tmp_path, "2,1,1", "--local-steps", 3, "--steps", 7]
    whole = run_mpi(2, [*common, "--save-at", 4], timeout=120)
    resumed = run_mpi(2, [*common, "--resume"], timeout=120)
    hex_losses = [[json.loads(line)["loss"] for line in run.stdout.splitlines() if line.startswith("{")]
                  for run in (whole, resumed)]
    assert len(hex_losses[0]) == 7 and hex_losses[1] == hex_losses[0][4:]


@pytest.mark.parametrize("layout, local, message", [
    ((2, 1, 1), False, r"is of local SGD \(local_steps=3\): each dp replica saved its own parameters"),
    ((1, 1, 2), True, r"in the layout it was saved in \(dp=2, tp=1, pp=1, cp=1, 2 ranks\)")])
def test_a_local_sgd_checkpoint_is_refused_where_its_replicas_cannot_continue(tmp_path, layout, local, message):
    save_local_sgd(tmp_path, (2, 1, 1), 4)

    def body():
        model = local_sgd_model(layout) if local else hybrid(*layout)
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(tmp_path, model)
    run_threads(2, body, timeout=TIMEOUT)


def test_a_plain_checkpoint_starts_local_sgd_from_its_parameters(tmp_path):
    """Loaded into a local SGD run, the first outer period starts at the loaded parameters:
    the same run as configuring local SGD after loading them."""
    layout = (2, 1, 1)

    def save():
        model = hybrid(*layout)
        train(model, range(2))
        save_checkpoint(tmp_path, model, step=2)

    def resume(configure_first):
        model = local_sgd_model(layout) if configure_first else hybrid(*layout)
        load_checkpoint(tmp_path, model)
        if not configure_first:
            model.configure_local_sgd(3)
        return train(model, range(2, 6))
    run_threads(2, save, timeout=TIMEOUT)
    loaded_into_local_sgd = run_threads(2, lambda: resume(True), timeout=TIMEOUT)[0]
    assert loaded_into_local_sgd == run_threads(2, lambda: resume(False), timeout=TIMEOUT)[0]  # bitwise
