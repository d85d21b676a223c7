"""Dropout under TP: replicated regions draw the same mask on every tp rank, sharded regions
(the rank's heads; sequence-parallel slices) independent ones; a run is deterministic for a
given seed and layout, and never touches minitensor's default generator."""
import numpy as np
import pytest
from tp_common import check_replicas_identical, make_batches, run_tensor_parallel

import minitensor as mt
import parallel
from minitensor.models import GPT, GPTConfig
from parallel import TensorParallelGPT
from parallel.tensor_parallel import TensorParallelRNG

CONFIG = dict(vocab_size=7, block_size=4, n_layer=2, n_head=2, d_model=4, dropout=0.3)


def run_twice(tp, sp, dropout_seed):
    batches = make_batches(CONFIG, 2, 4, 2, seed=1)
    run = lambda: run_tensor_parallel(CONFIG, 0, batches, parallel.world(), sp, dropout_seed)
    return [parallel.run_threads(tp, run, timeout=60) for _ in range(2)]


@pytest.mark.parametrize("sp", [False, True])
def test_a_run_with_dropout_is_deterministic_and_keeps_replicas_identical(sp):
    first, second = run_twice(2, sp, dropout_seed=5)
    for (records_a, state_a, _), (records_b, state_b, _) in zip(first, second):
        assert [loss for loss, _, _ in records_a] == [loss for loss, _, _ in records_b]
        for name in state_a:
            np.testing.assert_array_equal(state_a[name], state_b[name])
    check_replicas_identical([replicated for _, _, replicated in first])
    other_seed = run_twice(2, sp, dropout_seed=6)[0]
    assert first[0][0][0][0] != other_seed[0][0][0][0]  # the masks do depend on the seed


@pytest.mark.parametrize("sp", [False, True])
def test_residual_dropout_masks_are_shared_without_sp_and_independent_with_it(sp):
    mt.manual_seed(0)
    gpt = GPT(GPTConfig(**CONFIG))

    def masks():
        model = TensorParallelGPT(gpt, parallel.world(), sequence_parallel=sp)
        ones = mt.Tensor(np.ones((2, 2, 4), np.float32))
        return [m(ones).data != 0 for m in (model.drop, model.blocks[0].attn.resid_drop, model.blocks[1].mlp.drop)]

    rank0, rank1 = parallel.run_threads(2, masks, timeout=60)
    for a, b in zip(rank0, rank1):
        assert np.array_equal(a, b) != sp


def test_sharded_stream_differs_by_rank_and_fork_leaves_the_default_generator_alone():
    def draws():
        mt.manual_seed(3)
        rng = TensorParallelRNG(9, parallel.world().rank)
        with rng.fork_sharded():
            sharded = mt.default_generator().random(8)
        return sharded, rng.replicated.random(8), mt.default_generator().random(8)

    (sharded0, replicated0, default0), (sharded1, replicated1, default1) = parallel.run_threads(2, draws)
    assert not np.array_equal(sharded0, sharded1)
    np.testing.assert_array_equal(replicated0, replicated1)
    np.testing.assert_array_equal(default0, mt.manual_seed(3).random(8))
    np.testing.assert_array_equal(default0, default1)
