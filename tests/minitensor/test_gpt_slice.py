"""minitensor.models.GPTSlice: a GPT or BERT cut into consecutive slices is the model again —
the same parameters under the same names, the same loss and the same gradients, the mixture
of experts' balancing losses of an early slice included."""
import numpy as np
import pytest

import minitensor as mt
from minitensor.models import BERT, GPT, BertConfig, GPTConfig, GPTSlice

SIZES = dict(vocab_size=11, block_size=6, n_layer=4, n_head=2, d_model=8)


def slices(model, balance):
    ends = np.cumsum([0] + balance)
    return [GPTSlice(model, range(ends[s], ends[s + 1]), s, len(balance)) for s in range(len(balance))]


def loss_and_grads(model, run, idx):
    model.zero_grad()
    loss = run(idx)
    loss.backward()
    return loss.item(), {name: p.grad.copy() for name, p in model.named_parameters()}


def chained(pieces, targets):
    def run(x):
        for piece in pieces:
            x = piece(x, targets)
        return x
    return run


@pytest.mark.parametrize("balance", [[4], [1, 3], [2, 1, 1], [1, 1, 1, 1]])
@pytest.mark.parametrize("experts", [0, 3])
def test_slices_hold_the_model_under_its_names_and_give_its_loss_and_gradients(balance, experts):
    mt.manual_seed(0)
    model = GPT(GPTConfig(**SIZES, n_experts=experts, top_k=1, moe_every=2), dtype=np.float64)
    pieces = slices(model, balance)
    dense = dict(model.named_parameters())
    assert [n for piece in pieces for n, _ in piece.named_parameters()] == list(dense)  # disjoint, complete
    assert all(p is dense[n] for piece in pieces for n, p in piece.named_parameters())  # shared, not copied
    idx = np.random.default_rng(0).integers(0, 11, (2, 6))
    loss, grads = loss_and_grads(model, lambda i: model(i, i)[1], idx)
    sliced_loss, sliced_grads = loss_and_grads(model, chained(pieces, idx), idx)
    earlier_aux = sum(piece.last_aux for piece in pieces[:-1])  # attached to the activations, not in the loss
    assert sliced_loss + earlier_aux == pytest.approx(loss, rel=1e-12)
    for name in dense:  # with experts, block 1's balancing loss reaches backward through slice 0's output
        np.testing.assert_allclose(sliced_grads[name], grads[name], rtol=1e-10, atol=1e-14, err_msg=name)


def test_a_bert_s_last_slice_holds_the_tied_embedding_too():
    mt.manual_seed(0)
    first, last = slices(BERT(BertConfig(**SIZES), dtype=np.float64), [2, 2])
    assert first.tied_names() == last.tied_names() == ["tok_emb.weight"]
    assert last.tok_emb is first.tok_emb and last.tied_reads == {"mlm_head": ("tok_emb",)}


def test_a_slice_swaps_only_the_blocks_it_holds():
    mt.manual_seed(0)
    model = GPT(GPTConfig(**SIZES), dtype=np.float64)
    piece = GPTSlice(model, range(1, 3), 1, 3)
    replacement = GPT(GPTConfig(**SIZES), dtype=np.float64).blocks[0]
    piece.blocks[2] = replacement
    assert dict(piece.named_parameters())["blocks.2.attn.q.weight"] is replacement.attn.q.weight
    with pytest.raises(KeyError, match=r"holds blocks \[1, 2\], not block 3"):
        piece.blocks[3] = replacement
