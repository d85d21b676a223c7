"""Cutting a GPT into pipeline stages: balances, dense names, composition, gathering."""
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from parallel.pipeline import balance_by_cost, balance_by_parameters, balance_by_time, split_gpt, stages_for_rank


def gpt(n_layer, seed=0):
    mt.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=9, block_size=5, n_layer=n_layer, n_head=2, d_model=8)).double()


def compositions(n, parts):
    """Every way to write n as an ordered sum of `parts` positive ints."""
    for cuts in itertools.combinations(range(1, n), parts - 1):
        yield list(np.diff([0, *cuts, n]))


@given(costs=st.lists(st.integers(1, 20), min_size=1, max_size=7), data=st.data())
def test_balance_by_cost_minimises_the_slowest_stage(costs, data):
    stages = data.draw(st.integers(1, len(costs)))
    first, last = data.draw(st.integers(0, 10)), data.draw(st.integers(0, 10))

    def slowest(balance):
        bounds = np.cumsum([0, *balance])
        loads = [sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        loads[0] += first
        loads[-1] += last
        return max(loads)

    balance = balance_by_cost(costs, stages, first, last)
    assert sum(balance) == len(costs) and len(balance) == stages and min(balance) >= 1
    assert slowest(balance) == min(slowest(b) for b in compositions(len(costs), stages))


def test_parameter_balance_splits_equal_blocks_evenly_and_time_balance_is_valid():
    model = gpt(6)
    assert balance_by_parameters(model, 3) == [2, 2, 2]
    idx = np.zeros((2, 5), dtype=np.int64)
    balance = balance_by_time(model, 3, idx, idx, repeats=1)
    assert sum(balance) == 6 and len(balance) == 3 and min(balance) >= 1


def test_parameter_balance_weighs_the_embedding_and_the_head_on_the_end_stages():
    mt.manual_seed(0)  # a vocabulary of 1000 over d_model 8: each end holds ten blocks' worth of parameters
    heavy_ends = GPT(GPTConfig(vocab_size=1000, block_size=5, n_layer=6, n_head=2, d_model=8))
    assert balance_by_parameters(heavy_ends, 3) == [1, 4, 1]


@given(n_layer=st.integers(1, 5), data=st.data(), seed=seeds)
def test_stages_hold_the_dense_parameters_under_dense_names_and_compose_to_the_dense_loss(n_layer, data, seed):
    num_stages = data.draw(st.integers(1, n_layer))
    balance = data.draw(st.sampled_from(list(compositions(n_layer, num_stages))))
    model = gpt(n_layer, seed)
    stages = split_gpt(model, num_stages, balance)
    dense = dict(model.named_parameters())
    names = [n for stage in stages for n, _ in stage.named_parameters()]
    assert names == list(dense)  # disjoint, complete, in the dense order
    assert all(p is dense[n] for stage in stages for n, p in stage.named_parameters())  # shared, not copied
    rng = np.random.default_rng(seed)
    idx, targets = rng.integers(0, 9, (2, 5)), rng.integers(0, 9, (2, 5))
    x = idx
    for stage in stages:
        x = stage(x, targets)
    np.testing.assert_array_equal(x.data, model(idx, targets)[1].data)


def test_interleaved_ranks_hold_every_p_th_stage():
    chunks = stages_for_rank(gpt(4), rank=1, p=2, v=2)
    assert [s.stage for s in chunks] == [1, 3] and [s.blocks.indices() for s in chunks] == [[1], [3]]


def test_bad_balances_name_the_values():
    model = gpt(4)
    with pytest.raises(ValueError, match=r"balance \[1, 2\] sums to 3, but the GPT has n_layer=4"):
        split_gpt(model, 2, [1, 2])
    with pytest.raises(ValueError, match=r"balance \[4\] has 1 entries for 2 pipeline stages"):
        split_gpt(model, 2, [4])
    with pytest.raises(ValueError, match=r"balance \[0, 4\]: every stage needs a whole number ≥ 1"):
        split_gpt(model, 2, [0, 4])
    with pytest.raises(ValueError, match="n_layer=4 blocks into 5 pipeline stages"):
        split_gpt(model, 5)
