"""Knowledge distillation (minitensor.distill): the loss, its limits, its gradient, and a
teacher laid out otherwise than its student (teacher tp=2, student dp=2) giving the same loss."""
import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
import parallel
from minitensor.distill import distillation_loss, teacher_logits
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F
from parallel import DataParallel, run_threads
from parallel.tensor_parallel import TensorParallelGPT

TEACHER = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=16)
STUDENT = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8)


def model(config, seed):
    mt.manual_seed(seed)
    return GPT(config).double()


def data(seed, batch=4, seq=5):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 11, (batch, seq))
    targets[:, :2] = -100  # the same count per row, as the addition task's prompt
    return rng.integers(0, 11, (batch, seq)), targets


def reference_loss(s, t, y, alpha, T):
    """The formula, term by term in numpy."""
    def log_softmax(z):
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    counted = y != -100
    ce = -np.take_along_axis(log_softmax(s), np.where(counted, y, 0)[..., None], -1)[..., 0][counted].mean()
    p, log_p, log_q = np.exp(log_softmax(t / T)), log_softmax(t / T), log_softmax(s / T)
    kl = (p * (log_p - log_q)).sum(-1)[counted].mean()
    return alpha * ce + (1 - alpha) * T**2 * kl


@settings(max_examples=25)
@given(alpha=st.floats(0, 1), temperature=st.floats(0.5, 8), seed=st.integers(0, 2**16))
def test_the_loss_is_the_formula(alpha, temperature, seed):
    rng = np.random.default_rng(seed)
    s, t = rng.normal(size=(2, 3, 4, 7)) * 3
    _, y = data(seed, 3, 4)
    y = np.where(y == -100, -100, y % 7)
    loss = distillation_loss(mt.tensor(s), t, y, alpha, temperature)
    assert loss.item() == pytest.approx(reference_loss(s, t, y, alpha, temperature), rel=1e-10, abs=1e-12)


def test_limits_alpha_one_is_the_cross_entropy_and_a_perfect_student_has_no_soft_loss():
    s = np.random.default_rng(0).normal(size=(2, 3, 5))
    y = np.array([[1, -100, 2], [0, 4, -100]])
    ce = F.cross_entropy(mt.tensor(s), y).item()
    assert distillation_loss(mt.tensor(s), s * 0, y, alpha=1.0).item() == pytest.approx(ce, rel=1e-12)
    assert distillation_loss(mt.tensor(s), s, y, alpha=0.0, temperature=3.0).item() == pytest.approx(0, abs=1e-12)


def test_the_gradient_matches_central_differences_and_the_teacher_gets_none():
    teacher, student = model(TEACHER, 1), model(STUDENT, 2)
    idx, y = data(3)
    t = teacher_logits(teacher, idx)
    distillation_loss(student(idx)[0], t, y, 0.3, 2.5).backward()
    assert all(p.grad is None for p in teacher.parameters())
    w = student.blocks[0].mlp.fc.weight
    for index in [(0, 0), (5, 3)]:
        old = w.data[index]
        w.data[index] = old + 1e-6
        plus = distillation_loss(student(idx)[0], t, y, 0.3, 2.5).item()
        w.data[index] = old - 1e-6
        minus = distillation_loss(student(idx)[0], t, y, 0.3, 2.5).item()
        w.data[index] = old
        assert w.grad[index] == pytest.approx((plus - minus) / 2e-6, rel=1e-6, abs=1e-10)


def test_bad_arguments_are_clear_errors():
    s = mt.tensor(np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="alpha must be in \\[0, 1\\], got 1.5"):
        distillation_loss(s, np.zeros((1, 2, 3)), np.zeros((1, 2), int), alpha=1.5)
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        distillation_loss(s, np.zeros((1, 2, 3)), np.zeros((1, 2), int), temperature=0)
    with pytest.raises(ValueError, match=r"teacher logits \(1, 2, 4\) and student logits \(1, 2, 3\) differ"):
        distillation_loss(s, np.zeros((1, 2, 4)), np.zeros((1, 2), int))


def test_a_tensor_parallel_teacher_and_a_data_parallel_student_give_the_single_device_step():
    # 2 ranks: the teacher split tp=2 over them (its logits gathered from vocabulary shards),
    # the student replicated dp=2 (each rank its half of the rows, gradients averaged).
    idx, y = data(4)
    alpha, temperature = 0.4, 2.0
    student = model(STUDENT, 6)
    distillation_loss(student(idx)[0], teacher_logits(model(TEACHER, 5), idx), y, alpha, temperature).backward()
    ref_loss = distillation_loss(student(idx)[0], teacher_logits(model(TEACHER, 5), idx), y, alpha,
                                 temperature).item()
    ref_grads = {name: p.grad for name, p in student.named_parameters()}

    def rank_fn():
        group = parallel.world()
        teacher = TensorParallelGPT(model(TEACHER, 5), group)
        dp_student = DataParallel(model(STUDENT, 6), group)
        rows = slice(group.rank * 2, group.rank * 2 + 2)
        soft = teacher_logits(teacher, idx)[rows]  # every rank computes all rows' teacher logits (tp)
        loss = distillation_loss(dp_student(idx[rows])[0], soft, y[rows], alpha, temperature)
        loss.backward()
        mean = group.all_reduce(np.array([loss.item()]))[0] / group.size
        return mean, {name: p.grad for name, p in dp_student.named_parameters()}

    for loss, grads in run_threads(2, rank_fn, timeout=60):
        assert loss == pytest.approx(ref_loss, rel=1e-12)
        for name, ref in ref_grads.items():
            assert_close(grads[name], ref, err_msg=name)
