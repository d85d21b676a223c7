"""Exact parameter counts of the planned GPT (and BERT), dense and sharded by tp × pp."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
from minitensor.models.bert import BERT, BertConfig
from parallel import HybridGPT, Mesh, run_threads
from parallel.plan.model import (
    GPTConfig,
    balanced_partition,
    block_param_count,
    check_tp,
    dense_param_count,
    get_config,
    param_count,
    stage_layers,
)
from parallel.tensor_parallel.sharding import padded_size


@st.composite
def configs_and_grids(draw):
    """A small GPTConfig with a tp dividing its heads and a pp ≤ n_layer."""
    n_head = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    config = GPTConfig(vocab_size=draw(st.integers(1, 300)), block_size=draw(st.integers(1, 64)),
                       n_layer=draw(st.integers(1, 9)), n_head=n_head,
                       d_model=n_head * draw(st.integers(1, 16)))
    tp = draw(st.sampled_from([t for t in range(1, n_head + 1) if n_head % t == 0]))
    pp = draw(st.integers(1, config.n_layer))
    return config, tp, pp


def test_small_matches_a_hand_count():
    # d=128, V=64, s=64, 2 blocks:
    #   tok_emb 64·128 = 8192, pos_emb 64·128 = 8192
    #   block: ln_1 256 + q,k,v 3·(16384+128) + proj 16384+128 + ln_2 256
    #          + fc 4·16384+512 + proj 4·16384+128 = 198272; two blocks 396544
    #   ln_f 256, lm_head 64·128 = 8192
    assert dense_param_count(get_config("small")) == 8192 + 8192 + 396544 + 256 + 8192 == 421376


def test_gpt2_124m_dims_untied():
    # Untied lm_head: 163,037,184 = the familiar tied 124,439,808 + one more 50257·768 matrix.
    assert dense_param_count(get_config("gpt2-124m")) == 163_037_184
    assert 163_037_184 - 50257 * 768 == 124_439_808


@given(st.integers(1, 4096))
def test_block_count_is_12_d_squared_plus_13_d(d):
    assert block_param_count(d) == 12 * d * d + 13 * d


@given(configs_and_grids())
def test_tp_pp_shards_sum_to_dense_plus_duplicates(case):
    config, tp, pp = case
    d, L = config.d_model, config.n_layer
    replicated = L * (4 * d + d + d) + config.block_size * d + 2 * d   # LNs, row-parallel biases, pos_emb, ln_f
    padding = 2 * (padded_size(config.vocab_size, tp) - config.vocab_size) * d   # tok_emb + lm_head rows
    total = sum(tp * param_count(config, tp, pp, stage) for stage in range(pp))
    assert total == dense_param_count(config) + (tp - 1) * replicated + padding


def test_pipeline_stages_hold_embeddings_first_and_head_last():
    config = get_config("small")
    block = block_param_count(128)
    assert param_count(config, pp=2, stage=0) == block + 64 * 128 + 64 * 128
    assert param_count(config, pp=2, stage=1) == block + 2 * 128 + 64 * 128


def test_vocab_padding_to_a_multiple_of_tp():
    assert padded_size(50257, 8) == 50264
    assert padded_size(64, 4) == 64
    config = GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=4, d_model=8)
    # tp=4: tok_emb and lm_head shards have ceil(10/4)=3 rows each.
    assert param_count(config, tp=4) == block_param_count(8, 4) + 3 * 8 + 4 * 8 + 2 * 8 + 3 * 8


@given(st.integers(1, 200), st.data())
def test_balanced_partition(n_layer, data):
    pp = data.draw(st.integers(1, n_layer))
    layers = balanced_partition(n_layer, pp)
    assert sum(layers) == n_layer and len(layers) == pp
    assert layers == sorted(layers, reverse=True) and layers[0] - layers[-1] <= 1


def test_balanced_partition_examples_and_errors():
    assert balanced_partition(8, 3) == [3, 3, 2]
    assert balanced_partition(96, 8) == [12] * 8
    with pytest.raises(ValueError, match="pp=5.*n_layer=4"):
        balanced_partition(4, 5)
    with pytest.raises(ValueError, match=r"balance=\[1, 1\]"):
        stage_layers(4, 2, [1, 1])
    assert stage_layers(4, 2, [3, 1]) == [3, 1]


def test_bad_dims_are_rejected_with_the_values():
    with pytest.raises(ValueError, match="tp=3.*n_head=8"):
        check_tp(get_config("medium"), 3)
    with pytest.raises(ValueError, match="d_model=10.*n_head=4"):
        GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=4, d_model=10)
    with pytest.raises(ValueError, match="n_layer"):
        GPTConfig(vocab_size=8, block_size=8, n_layer=0, n_head=1, d_model=8)
    with pytest.raises(ValueError, match="unknown config 'huge'"):
        get_config("huge")


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 3), (2, 2)])
def test_bert_counts_are_the_real_ranks_parameters_with_the_tied_copy(tp, pp):
    # The planner's rule, against the parameters each rank of a real 3D BERT holds.
    config = BertConfig(vocab_size=9, block_size=6, n_layer=3, n_head=2, d_model=8, sep_id=1)
    balance = balanced_partition(config.n_layer, pp)

    def counts():
        mt.manual_seed(0)
        model = HybridGPT(BERT(config), Mesh(1, tp, pp), balance=balance)
        return model.mesh.pp_rank, model.num_parameters()

    for stage, count in run_threads(tp * pp, counts, timeout=60):
        assert count == param_count(config, tp, pp, stage, balance)
    assert dense_param_count(config) == BERT(config).num_parameters()
