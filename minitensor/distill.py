"""Knowledge distillation (Hinton et al. 2015): a small student learns from a trained teacher.

The teacher's logits t, softened by a temperature T, are a richer target than the one-hot
label: they say which wrong answers are nearly right. The student's logits s are trained on

    loss = α · CE(s, y)  +  (1 − α) · T² · KL( softmax(t/T) ‖ softmax(s/T) )

both terms a mean over the counted tokens (labels ≠ -100). The T² keeps the soft term's
gradient the size of the hard one's: d KL / d s = (softmax(s/T) − softmax(t/T)) / T, and
the two softmaxes differ by O(1/T) for large T, so the gradient is O(1/T²) without it.

The teacher runs in eval mode under `no_grad`: no graph is recorded, no gradient reaches it.
It may have any layout that hands back dense logits: a dense model, or a tensor-parallel
one (`gather_logits` joins its vocabulary shards), so teacher and student can be laid out
differently and the loss is still the single-device one.
"""
import numpy as np

from minitensor.autograd import no_grad
from minitensor.nn import functional as F
from minitensor.tensor import Tensor


@no_grad()
def teacher_logits(teacher, idx):
    """The teacher's dense logits of `idx` as an array, in eval mode (dropout off), no graph."""
    was_training = teacher.training
    teacher.eval()
    try:
        logits = teacher(idx)[0]
        if hasattr(teacher, "gather_logits"):  # tensor parallel: the vocabulary shards joined
            return teacher.gather_logits(logits)
        return logits.data
    finally:
        teacher.train(was_training)


def distillation_loss(student_logits, teacher_logits, targets, alpha=0.5, temperature=2.0, ignore_index=-100):
    """α·CE(student, targets) + (1−α)·T²·KL(softmax(teacher/T) ‖ softmax(student/T)), a Tensor.

    student_logits: Tensor (..., V); teacher_logits: array (..., V), a constant; targets (...)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"distillation_loss: alpha must be in [0, 1], got {alpha}")
    if temperature <= 0:
        raise ValueError(f"distillation_loss: temperature must be > 0, got {temperature}")
    teacher_logits = np.asarray(teacher_logits)
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"distillation_loss: teacher logits {teacher_logits.shape} and student logits "
                         f"{student_logits.shape} differ")
    targets = np.asarray(targets)
    hard = F.cross_entropy(student_logits, targets, ignore_index)
    # exercise 17.4: the distillation loss
    # hint: soft teacher: log p = log_softmax(t/T) in numpy (a constant); student: log q = F.log_softmax(s/T);
    # hint: KL per token = Σ_v p (log p − log q); mean it over tokens with targets ≠ ignore_index; then
    # hint: α·hard + (1−α)·T²·KL.
    t = teacher_logits.astype(np.float64) / temperature
    log_p = t - t.max(axis=-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=-1, keepdims=True))
    log_q = F.log_softmax(student_logits / temperature, axis=-1)
    dtype = student_logits.dtype
    kl = (Tensor(np.exp(log_p).astype(dtype)) * (Tensor(log_p.astype(dtype)) - log_q)).sum(axis=-1)
    counted = targets != ignore_index
    soft = (kl * Tensor(counted.astype(dtype))).sum() / max(int(counted.sum()), 1)
    return hard * alpha + soft * ((1 - alpha) * temperature**2)
    # end exercise
