"""The reference GPT: its whole backward against gradcheck, reproducible init, generation,
and causality."""
import threading

import numpy as np
import pytest

import minitensor as mt
from minitensor.models import GPT, GPTConfig

TINY = dict(vocab_size=5, block_size=4, n_layer=2, n_head=2, d_model=4)


def tiny_gpt(causal=True, seed=0):
    """A float64 GPT whose weights are O(1), so no gradient hides below gradcheck's atol."""
    mt.manual_seed(seed)
    model = GPT(GPTConfig(**TINY, causal=causal)).double()
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = rng.standard_normal(p.shape) * 0.5
    return model


@pytest.mark.parametrize("causal", [True, False])
def test_whole_gpt_logits_gradcheck(causal):
    model = tiny_gpt(causal)
    idx = np.array([[1, 4, 0], [2, 2, 3]])
    assert mt.gradcheck(lambda *params: model(idx)[0], *model.parameters())


def test_whole_gpt_loss_gradcheck():
    model = tiny_gpt(seed=1)
    idx, targets = np.array([[0, 1, 2, 3], [4, 3, 2, 1]]), np.array([[1, 2, 3, 4], [3, 2, 1, -100]])
    assert mt.gradcheck(lambda *params: model(idx, targets)[1], *model.parameters())


def test_same_seed_gives_bit_identical_weights_in_any_thread():
    config = GPTConfig(**TINY)
    mt.manual_seed(7)
    first = GPT(config).state_dict()
    mt.manual_seed(7)
    second = GPT(config).state_dict()
    in_thread = {}
    thread = threading.Thread(target=lambda: (mt.manual_seed(7), in_thread.update(GPT(config).state_dict())))
    thread.start()
    thread.join()
    mt.manual_seed(8)
    other = GPT(config).state_dict()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
        np.testing.assert_array_equal(first[name], in_thread[name], err_msg=name)
    assert not np.array_equal(first["blocks.0.attn.q.weight"], other["blocks.0.attn.q.weight"])


def test_generate_appends_tokens_and_crops_to_the_block():
    mt.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    idx = np.array([[1, 2], [3, 4]])
    out = model.generate(idx, max_new_tokens=5, generator=np.random.default_rng(0))
    assert out.shape == (2, 7) and out.dtype.kind == "i"
    np.testing.assert_array_equal(out[:, :2], idx)
    assert out.min() >= 0 and out.max() < TINY["vocab_size"]
    again = model.generate(idx, max_new_tokens=5, generator=np.random.default_rng(0))
    np.testing.assert_array_equal(out, again)
    greedy = model.generate(idx, max_new_tokens=3, greedy=True)
    logits, _ = model(idx)
    np.testing.assert_array_equal(greedy[:, 2], logits.data[:, -1].argmax(-1))
    assert mt.is_grad_enabled()


@pytest.mark.parametrize("causal", [True, False])
def test_a_future_token_changes_earlier_logits_only_without_the_causal_mask(causal):
    model = tiny_gpt(causal)
    idx = np.array([[1, 2, 3, 4]])
    changed = idx.copy()
    changed[0, 2] = 0
    before, after = model(idx)[0].data, model(changed)[0].data
    assert np.array_equal(before[:, :2], after[:, :2]) == causal
    assert not np.allclose(before[:, 2:], after[:, 2:])


def test_config_and_sequence_length_errors():
    with pytest.raises(ValueError, match="d_model=6.*n_head=4"):
        GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=4, d_model=6)
    with pytest.raises(ValueError, match="length 5.*block_size 4"):
        GPT(GPTConfig(**TINY))(np.zeros((1, 5), int))
