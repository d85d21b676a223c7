"""The TP layers one by one against their dense counterparts, and the clear errors of every
indivisible configuration. Threads backend; float64; gradients gathered back to dense shape."""
import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds

import minitensor as mt
import parallel
from minitensor import nn
from minitensor.models import GPT, GPTConfig
from minitensor.models.gpt import MLP
from minitensor.nn import functional as F
from parallel import (
    ColumnParallelLinear,
    ParallelMLP,
    RowParallelLinear,
    TensorParallelGPT,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from parallel.tensor_parallel import full_grads, full_state_dict

tp_sizes = st.sampled_from([1, 2, 3, 4])


def on_threads(tp, fn):
    return parallel.run_threads(tp, lambda: fn(parallel.world()), timeout=60)


@given(tp=tp_sizes, width=st.integers(1, 3), d_in=st.integers(1, 5), bias=st.booleans(), seed=seeds)
def test_column_then_row_with_gathered_output_and_scattered_input_equal_two_dense_linears(tp, width, d_in, bias, seed):
    """Column (gather_output=True) then Row (input_is_parallel=False): the gather and split ops."""
    column_then_row_equal_two_dense_linears(tp, width, d_in, bias, seed, gathered=True)


@given(tp=tp_sizes, width=st.integers(1, 3), d_in=st.integers(1, 5), bias=st.booleans(), seed=seeds)
def test_column_then_row_keeping_the_split_between_them_equal_two_dense_linears(tp, width, d_in, bias, seed):
    """Megatron's pairing: Column (gather_output=False) hands its split output straight to Row
    (input_is_parallel=True); nothing is gathered in between."""
    column_then_row_equal_two_dense_linears(tp, width, d_in, bias, seed, gathered=False)


def column_then_row_equal_two_dense_linears(tp, width, d_in, bias, seed, gathered):
    hidden, rng = tp * width, np.random.default_rng(seed)
    mt.manual_seed(seed)
    first, second = nn.Linear(d_in, hidden, bias).double(), nn.Linear(hidden, 3, bias).double()
    x = rng.standard_normal((2, 3, d_in))
    dy = rng.standard_normal((2, 3, 3))

    def grads_of(run):
        inp = mt.Tensor(x.copy(), requires_grad=True)
        y = run(inp)
        y.backward(dy)
        return y.data, inp.grad

    ref_y, ref_dx = grads_of(lambda inp: second(first(inp)))

    def rank(group):
        column = ColumnParallelLinear(first, group, gather_output=gathered)
        row = RowParallelLinear(second, group, input_is_parallel=not gathered)
        y, dx = grads_of(lambda inp: row(column(inp)))
        return y, dx, full_grads(column, group), full_grads(row, group), full_state_dict(column, group)

    for y, dx, column_grads, row_grads, column_state in on_threads(tp, rank):
        assert_close(y, ref_y)
        assert_close(dx, ref_dx)
        for dense, grads in ((first, column_grads), (second, row_grads)):
            assert list(grads) == [name for name, _ in dense.named_parameters()]
            for name, p in dense.named_parameters():
                assert_close(grads[name], p.grad)
        assert_close(column_state["weight"], first.weight.data)


@given(tp=tp_sizes, vocab=st.integers(1, 10), seq=st.integers(1, 4), ignored=st.floats(0, 1), seed=seeds)
def test_vocab_parallel_embedding_and_cross_entropy_equal_dense_with_padding_and_ignore_index(
        tp, vocab, seq, ignored, seed):
    rng = np.random.default_rng(seed)
    mt.manual_seed(seed)
    emb, head = nn.Embedding(vocab, 4).double(), nn.Linear(4, vocab, bias=False).double()
    idx = rng.integers(0, vocab, (2, seq))
    targets = np.where(rng.random((2, seq)) < ignored, -100, rng.integers(0, vocab, (2, seq)))
    ref = F.cross_entropy(head(emb(idx)), targets)
    ref.backward()

    def rank(group):
        p_emb = VocabParallelEmbedding(emb, group)
        p_head = ColumnParallelLinear(head, group, pad_out_features=True)
        logits = p_head(p_emb(idx))
        loss = vocab_parallel_cross_entropy(logits, targets, group, vocab_size=vocab)
        loss.backward()
        padding = p_head.weight.grad[max(0, vocab - group.rank * p_head.weight.shape[0]):]
        return loss.item(), full_grads(p_emb, group)["weight"], full_grads(p_head, group)["weight"], padding

    for loss, emb_grad, head_grad, padding_grad in on_threads(tp, rank):
        assert_close(loss, ref.item())
        assert_close(emb_grad, emb.weight.grad)
        assert_close(head_grad, head.weight.grad)
        assert not padding_grad.any()  # padding rows never receive gradient


def test_padding_columns_never_win_the_softmax():
    """Real logits far below zero and zero-valued padding columns: the loss must ignore the padding."""
    logits_full = np.full((1, 1, 3), -50.0)
    logits_full[..., 1] = -40.0
    ref = F.cross_entropy(mt.Tensor(logits_full), np.array([[1]])).item()

    def rank(group):
        padded = np.concatenate([logits_full, np.zeros((1, 1, 1))], axis=-1)  # V=3 padded to 4 for tp=2
        local = mt.Tensor(padded[..., group.rank * 2:(group.rank + 1) * 2].copy())
        return vocab_parallel_cross_entropy(local, np.array([[1]]), group, vocab_size=3).item()

    for loss in on_threads(2, rank):
        assert_close(loss, ref)


def _raises_on_threads(tp, build, *fragments):
    with pytest.raises(ValueError) as info:
        on_threads(tp, build)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_heads_not_divisible_by_tp_is_a_clear_error():
    mt.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=3, d_model=6))
    _raises_on_threads(2, lambda g: TensorParallelGPT(gpt, g), "n_head 3", "tensor-parallel size 2")


def test_hidden_sizes_not_divisible_by_tp_are_clear_errors():
    _raises_on_threads(4, lambda g: ColumnParallelLinear(nn.Linear(4, 6), g), "out_features 6",
                       "tensor-parallel size 4")
    _raises_on_threads(4, lambda g: RowParallelLinear(nn.Linear(6, 4), g), "in_features 6", "tensor-parallel size 4")
    config = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, d_model=3)
    _raises_on_threads(5, lambda g: ParallelMLP(MLP(config), g), "4·d_model = 12", "tensor-parallel size 5")


def test_sequence_parallel_needs_the_sequence_divisible_by_tp():
    mt.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, d_model=4))
    _raises_on_threads(2, lambda g: TensorParallelGPT(gpt, g, sequence_parallel=True)(np.zeros((1, 3), int)),
                       "sequence length 3", "tensor-parallel size 2")
