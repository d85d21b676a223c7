"""ZeRO-1 on the threads backend: AdamW on one device, with 1/n of the optimizer state per rank."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_scripts.dp_common import check_zero, make_data, run_single, run_zero, tiny_net
from strategies import seeds

import minitensor as mt
import parallel
from minitensor import nn
from parallel import ZeroOptimizer, run_threads

STEPS = 3


def train_and_check(model_name, seed, n, micro, rows=2):
    data = make_data(seed, n, micro, rows, STEPS)
    ref = run_single(model_name, seed, data)
    runs = run_threads(n, lambda: run_zero(parallel.world(), model_name, seed, data, micro), timeout=60)
    for run in runs:
        check_zero(run, ref, n, STEPS)


@given(n=st.integers(1, 4), micro=st.integers(1, 3), seed=seeds)
def test_equals_adamw_on_one_device(n, micro, seed):
    train_and_check("tiny", seed, n, micro)


@pytest.mark.parametrize("n", [2, 3])
def test_gpt_equals_adamw_on_one_device(n):
    train_and_check("gpt", 11, n, micro=2)


def steps_with_checkpoint(total, save_at):
    """AdamW steps on 2 ranks; at `save_at`, the shards go through state_dict into fresh optimizers."""
    def rank_fn():
        group = parallel.world()
        mt.manual_seed(3)
        model = tiny_net()
        opt = ZeroOptimizer(model.parameters(), group, lr=0.1)
        data = make_data(5, 1, 1, 2, total)
        for step, (idx, targets) in enumerate(data):
            if step == save_at:
                saved = opt.state_dict()
                opt = ZeroOptimizer(model.parameters(), group, lr=0.1)
                opt.load_state_dict(saved)
            opt.zero_grad()
            model(idx, targets)[1].backward()
            opt.step()
        return model.state_dict()
    return run_threads(2, rank_fn, timeout=30)


def test_state_dict_round_trip_continues_the_same_run():
    for resumed, straight in zip(steps_with_checkpoint(3, save_at=2), steps_with_checkpoint(3, save_at=None)):
        for name in straight:
            np.testing.assert_array_equal(resumed[name], straight[name])


def test_load_state_dict_rejects_another_ranks_shard():
    def rank_fn():
        group = parallel.world()
        opt = ZeroOptimizer(tiny_net().parameters(), group)
        theirs = group.all_gather(np.array([group.rank]))  # only to agree on who is who
        saved = opt.state_dict()
        saved["rank"] = int(theirs[1 - group.rank])
        opt.load_state_dict(saved)

    with pytest.raises(ValueError, match=r"the shard was saved at \{'rank': ., 'size': 2, 'numel': \d+\}, "
                                         r"this optimizer is at \{'rank': ., 'size': 2"):
        run_threads(2, rank_fn, timeout=30)


def test_rejects_trainable_parameters_of_two_dtypes():
    params = [nn.Parameter(np.zeros(2, np.float32)), nn.Parameter(np.zeros(2, np.float64))]
    with pytest.raises(ValueError, match=r"one dtype, got \['float32', 'float64'\]"):
        ZeroOptimizer(params, parallel.world())
