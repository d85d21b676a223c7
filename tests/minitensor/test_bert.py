"""BERT (minitensor.models.bert), its masking rule (data.mlm) and its task (data.masked_addition)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
from minitensor.data.masked_addition import MASK, SEP, MaskedAdditionTask, masked_digit_accuracy
from minitensor.data.mlm import IGNORE_INDEX, mask_tokens
from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW


def tiny(**overrides):
    config = dict(vocab_size=9, block_size=8, n_layer=2, n_head=2, d_model=8, sep_id=3)
    return BertConfig(**{**config, **overrides})


# --- the masking rule --------------------------------------------------------------

@settings(max_examples=30)
@given(rows=st.integers(1, 5), length=st.integers(1, 12), prob=st.floats(0.05, 1.0), seed=st.integers(0, 2**32 - 1))
def test_every_row_gets_the_same_count_of_labels_at_maskable_positions_only(rows, length, prob, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10, (rows, length))
    maskable = np.ones_like(ids, bool)
    maskable[:, 0] = length == 1  # the first position is a separator (unless it is all there is)
    inputs, labels = mask_tokens(ids, np.random.default_rng(seed), 99, maskable, np.arange(10), prob)
    chosen = labels != IGNORE_INDEX
    expected = max(1, round(prob * maskable[0].sum()))
    assert (chosen.sum(axis=1) == expected).all()
    assert not (chosen & ~maskable).any()
    np.testing.assert_array_equal(labels[chosen], ids[chosen])   # labels: the original tokens
    np.testing.assert_array_equal(inputs[~chosen], ids[~chosen])  # nothing else changes
    again = mask_tokens(ids, np.random.default_rng(seed), 99, maskable, np.arange(10), prob)
    np.testing.assert_array_equal(again[0], inputs)  # a pure function of (ids, generator)


def test_chosen_tokens_are_80_percent_mask_10_random_10_unchanged():
    ids = np.full((4000, 50), 7)
    inputs, labels = mask_tokens(ids, np.random.default_rng(0), 99, np.ones_like(ids, bool), np.arange(5), 0.2)
    chosen = inputs[labels != IGNORE_INDEX]  # 40 000 chosen tokens: ±0.5% is > 3 standard deviations
    assert len(chosen) == 4000 * 10
    assert abs((chosen == 99).mean() - 0.8) < 0.006
    assert abs(np.isin(chosen, np.arange(5)).mean() - 0.1) < 0.005  # random tokens (7 is not among them)
    assert abs((chosen == 7).mean() - 0.1) < 0.005                   # left unchanged


def test_masking_errors_name_the_values():
    with pytest.raises(ValueError, match=r"maskable \(2,\) must have the shape of ids \(1, 2\)"):
        mask_tokens(np.zeros((1, 2), int), np.random.default_rng(0), 9, np.ones(2, bool), [1])
    with pytest.raises(ValueError, match="mask_prob must be in \\(0, 1\\], got 0"):
        mask_tokens(np.zeros((1, 2), int), np.random.default_rng(0), 9, np.ones((1, 2), bool), [1], 0)


def test_the_masked_addition_task_masks_digits_never_separators():
    task = MaskedAdditionTask(digits=2, seed=0)
    inputs, labels = task.get_batch(64, generator=np.random.default_rng(1))
    seq = task.sequences(*task.problems(64, "train", np.random.default_rng(1)))
    assert inputs.shape == labels.shape == (64, task.block_size) == seq.shape
    np.testing.assert_array_equal(labels[labels != IGNORE_INDEX], seq[labels != IGNORE_INDEX])
    assert (seq[labels != IGNORE_INDEX] < 10).all()  # digits only: 7 digits x 15% → 1 per row
    assert ((labels != IGNORE_INDEX).sum(axis=1) == 1).all()
    np.testing.assert_array_equal(inputs == SEP, seq == SEP)
    assert (inputs == MASK).any() and (inputs[seq == SEP] == SEP).all()


# --- the model ---------------------------------------------------------------------

def test_segments_start_after_the_first_separator():
    config = tiny()
    ids = np.array([[1, 2, 3, 4, 3, 5], [3, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(config.segment_ids(ids), [[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]])


def test_attention_is_bidirectional_where_the_gpt_is_causal():
    ids = np.array([[1, 2, 4, 5, 6]])
    later = ids.copy()
    later[0, -1] = 7
    mt.manual_seed(0)
    bert = BERT(tiny()).double()
    first = lambda model, x: model(x)[0].data[0, 0]
    assert not np.allclose(first(bert, ids), first(bert, later))  # position 0 sees the last token
    mt.manual_seed(0)
    gpt = GPT(GPTConfig(9, 8, 2, 2, 8)).double()
    np.testing.assert_array_equal(first(gpt, ids), first(gpt, later))


def test_the_mlm_head_is_tied_to_the_token_embedding():
    mt.manual_seed(0)
    model = BERT(tiny()).double()
    names = [name for name, _ in model.named_parameters()]
    assert names[:3] == ["tok_emb.weight", "pos_emb.weight", "seg_emb.weight"]
    assert names[-5:] == ["mlm_head.bias", "mlm_head.dense.weight", "mlm_head.dense.bias",
                          "mlm_head.norm.weight", "mlm_head.norm.bias"]  # and no decoder weight of its own
    # The gradient of the one embedding parameter is the sum of its two uses: central differences agree.
    ids = np.array([[1, 2, 3, 4, 8, 0]])
    targets = np.array([[-100, 5, -100, -100, 2, -100]])
    _, loss = model(ids, targets)
    loss.backward()
    weight = model.tok_emb.weight
    for row, col in [(1, 0), (5, 3), (7, 2)]:  # 1: looked up; 5: only predicted; 7: neither, still in the softmax
        eps, old = 1e-6, weight.data[row, col]
        weight.data[row, col] = old + eps
        plus = model(ids, targets)[1].item()
        weight.data[row, col] = old - eps
        minus = model(ids, targets)[1].item()
        weight.data[row, col] = old
        assert weight.grad[row, col] == pytest.approx((plus - minus) / (2 * eps), rel=1e-6, abs=1e-10)


def test_only_labelled_positions_count_in_the_loss():
    mt.manual_seed(0)
    model = BERT(tiny()).double()
    ids = np.array([[1, 2, 3, 4, 8, 0]])
    one = np.full_like(ids, IGNORE_INDEX)
    one[0, 1] = 5
    logits, loss = model(ids, one)
    z = logits.data[0, 1]
    assert loss.item() == pytest.approx(np.log(np.exp(z - z.max()).sum()) + z.max() - z[5])


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match="causal must be False"):
        tiny(causal=True)
    with pytest.raises(ValueError, match=r"sep_id=9 outside the vocabulary \[0, 9\)"):
        tiny(sep_id=9)
    with pytest.raises(TypeError, match="BERT needs a BertConfig, got GPTConfig"):
        BERT(GPTConfig(9, 8, 2, 2, 8))
    with pytest.raises(ValueError, match="BERT: sequence length 9 exceeds block_size 8"):
        BERT(tiny())(np.zeros((1, 9), int))


# --- it learns ------------------------------------------------------------------------

def test_a_small_bert_learns_to_fill_in_masked_digits_of_additions():
    # Fixed seed and step count. Chance is 10% (one digit of ten). 1-digit problems ("a+b=" and
    # a 2-digit sum), 10 of the 100 pairs held out: with this seed the held-out accuracy is
    # 0.59 after 300 steps (0.22 after 50, 0.70 after 400); the bound leaves room for the
    # trajectory to shift a little with the BLAS build.
    task = MaskedAdditionTask(digits=1, seed=0)
    mt.manual_seed(0)
    model = BERT(BertConfig(task.vocab_size, task.block_size, n_layer=2, n_head=4, d_model=64, sep_id=SEP))
    optimizer = AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    before = masked_digit_accuracy(model, task, num_problems=500)
    for step in range(300):
        idx, labels = task.get_batch(64, generator=np.random.default_rng([0, step]))
        optimizer.zero_grad()
        model(idx, labels)[1].backward()
        optimizer.step()
    after = masked_digit_accuracy(model, task, num_problems=500)
    assert before < 0.25 and after > 0.4, (before, after)
