"""The built-in addition task, its split and exact-match scoring, and char-level text batches."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
from minitensor.data import AdditionTask, CharDataset, exact_match, recommended_config
from minitensor.models import GPT, GPTConfig

# ---- AdditionTask -------------------------------------------------------------------

def test_a_problem_is_zero_padded_operands_and_the_reversed_padded_sum():
    task = AdditionTask(digits=3)
    assert task.decode(task.sequences([54], [367])[0]) == "054+367=1240"
    assert task.decode(task.sequences([999], [999])[0]) == "999+999=8991"
    assert task.block_size == len("054+367=124") and task.prompt_length == len("054+367=")


def test_encode_and_decode_are_inverse_and_reject_foreign_characters():
    task = AdditionTask(digits=2)
    assert task.decode(task.encode("12+34=640")) == "12+34=640"
    with pytest.raises(ValueError, match=r"\['x'\]"):
        task.encode("1x")


@given(digits=st.integers(1, 6), batch=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_batches_predict_the_answer_characters_only(digits, batch, seed):
    task = AdditionTask(digits=digits, seed=seed)
    idx, targets = task.get_batch(batch)
    assert idx.shape == targets.shape == (batch, task.block_size)
    assert idx.dtype == targets.dtype == np.int64
    prompt = task.prompt_length
    assert (targets[:, : prompt - 1] == -100).all()
    np.testing.assert_array_equal(targets[:, prompt - 1 :][:, :-1], idx[:, prompt:])  # next character
    for row, answer in zip(idx, targets[:, prompt - 1 :]):  # the answer is the reversed sum
        a, b = task.decode(row[:prompt]).rstrip("=").split("+")
        assert int(task.decode(answer)[::-1]) == int(a) + int(b)
        assert len(a) == len(b) == digits


@given(seed=st.integers(0, 2**32 - 1))
def test_training_never_draws_a_held_out_problem_and_the_split_is_fixed_by_the_seed(seed):
    task = AdditionTask(digits=3, heldout_fraction=0.2, seed=seed)
    a, b = task.problems(2000, "train")
    assert not task.is_heldout(a, b).any()
    ha, hb = task.problems(200, "heldout")
    assert task.is_heldout(ha, hb).all()
    grid = np.arange(1000)
    again = AdditionTask(digits=3, heldout_fraction=0.2, seed=seed)
    np.testing.assert_array_equal(task.is_heldout(grid, grid[::-1]), again.is_heldout(grid, grid[::-1]))


def test_the_held_out_fraction_is_kept_and_another_seed_holds_out_other_problems():
    a, b = (x.ravel() for x in np.meshgrid(np.arange(1000), np.arange(1000)))
    split0 = AdditionTask(3, heldout_fraction=0.1, seed=0).is_heldout(a, b)
    split1 = AdditionTask(3, heldout_fraction=0.1, seed=1).is_heldout(a, b)
    assert abs(split0.mean() - 0.1) < 0.002  # 10⁶ pairs: the standard error is 0.0003
    assert abs((split0 & split1).mean() - 0.01) < 0.001  # independent splits overlap by 0.1²


def test_batches_are_reproducible_from_the_seed_or_a_generator():
    first, second = AdditionTask(2, seed=5).get_batch(4), AdditionTask(2, seed=5).get_batch(4)
    np.testing.assert_array_equal(first[0], second[0])
    task = AdditionTask(2)
    x = task.get_batch(4, generator=np.random.default_rng(9))[0]
    np.testing.assert_array_equal(x, task.get_batch(4, generator=np.random.default_rng(9))[0])


def test_bad_arguments_name_their_values():
    with pytest.raises(ValueError, match="digits must be in \\[1, 9\\], got 0"):
        AdditionTask(digits=0)
    with pytest.raises(ValueError, match="heldout_fraction .* got 1.5"):
        AdditionTask(heldout_fraction=1.5)
    with pytest.raises(ValueError, match="'test'"):
        AdditionTask().problems(3, "test")


# ---- exact_match --------------------------------------------------------------------

class Oracle:
    """Logits whose argmax is the right next character of an addition prompt, except the
    answer character number `wrong_at` (0-based), which is off by one."""

    def __init__(self, task, wrong_at=None):
        self.task, self.wrong_at = task, wrong_at
        self.training = True
        self.calls = []

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def __call__(self, idx):
        self.calls.append(self.training)
        task, p = self.task, self.task.prompt_length
        a = [int(task.decode(row[: task.digits])) for row in idx]
        b = [int(task.decode(row[task.digits + 1 : p - 1])) for row in idx]
        nxt = task.sequences(a, b)[:, idx.shape[1]]
        if idx.shape[1] - p == self.wrong_at:
            nxt = (nxt + 1) % 10
        logits = np.zeros(idx.shape + (task.vocab_size,), np.float32)
        logits[:, -1, :] = np.eye(task.vocab_size, dtype=np.float32)[nxt]
        return mt.tensor(logits), None


def test_exact_match_is_one_for_a_perfect_model_and_restores_its_mode():
    task = AdditionTask(digits=2, seed=3)
    oracle = Oracle(task)
    assert exact_match(oracle, task, num_problems=50) == 1.0
    assert oracle.calls == [False] * task.answer_length and oracle.training  # eval mode, then restored


@pytest.mark.parametrize("wrong_at", [0, 1, 2])
def test_exact_match_scores_each_answer_as_a_whole(wrong_at):
    task = AdditionTask(digits=2, seed=3)
    assert exact_match(Oracle(task, wrong_at=wrong_at), task, num_problems=50) == 0.0


def test_exact_match_runs_a_gpt_and_keeps_its_mode():
    task = AdditionTask(digits=2)
    mt.manual_seed(0)
    model = GPT(GPTConfig(task.vocab_size, task.block_size, n_layer=1, n_head=2, d_model=16, dropout=0.1))
    score = exact_match(model, task, num_problems=20)
    assert 0.0 <= score <= 1.0 and model.training
    assert exact_match(model, task, num_problems=20) == score  # eval mode: dropout off, deterministic


def test_the_recommended_config_fits_the_task():
    cfg = recommended_config()
    task = AdditionTask(cfg["digits"])
    GPTConfig(task.vocab_size, task.block_size, cfg["n_layer"], cfg["n_head"], cfg["d_model"])
    assert cfg["steps"] > 0 and cfg["batch_size"] > 0 and cfg["lr"] > 0


# ---- CharDataset ----------------------------------------------------------------------

TEXT = "to be, or not to be: that is the question"


def test_char_vocabulary_is_the_sorted_distinct_characters_and_round_trips():
    data = CharDataset(TEXT, block_size=8)
    assert data.chars == sorted(set(TEXT)) and data.vocab_size == len(set(TEXT))
    assert data.decode(data.encode("not to be")) == "not to be"
    with pytest.raises(ValueError, match=r"\['Z'\]"):
        data.encode("Zoo")


@given(block=st.integers(1, 20), batch=st.integers(1, 6), seed=st.integers(0, 1000))
def test_char_batches_are_windows_of_the_text_and_their_next_characters(block, batch, seed):
    data = CharDataset(TEXT, block_size=block, seed=seed)
    idx, targets = data.get_batch(batch)
    assert idx.shape == targets.shape == (batch, block) and idx.dtype == np.int64
    for x, y in zip(idx, targets):
        window = data.decode(x)
        start = [i for i in range(len(TEXT) - block) if TEXT[i : i + block] == window]
        assert start and any(TEXT[i + 1 : i + block + 1] == data.decode(y) for i in start)
    again = CharDataset(TEXT, block_size=block, seed=seed).get_batch(batch)
    np.testing.assert_array_equal(idx, again[0])


def test_char_dataset_rejects_text_too_short_for_the_block():
    with pytest.raises(ValueError, match="3 characters .* block_size 3"):
        CharDataset("abc", block_size=3)
    with pytest.raises(TypeError, match="bytes"):
        CharDataset(b"abcdef", block_size=2)
