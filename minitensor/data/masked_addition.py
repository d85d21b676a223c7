"""The addition task for a bidirectional model: fill in masked digits of a valid addition.

One problem is the whole string of `AdditionTask` (its held-out split, its reversed sum):

    "054+367=1240"      (54 + 367 = 421, the sum written reversed) the digits of both operands
                        and of the sum may be masked; '+' and '=' never are ('=' ends segment A)

A masked digit is determined by the others (a sum digit by adding, an operand digit by
subtracting), so a model that fills them in has learned addition from both sides.
Training batches follow BERT's masking rule (`mlm.mask_tokens`, 15%, 80-10-10); the
metric `masked_digit_accuracy` masks one digit of each held-out problem with [MASK].
"""
import numpy as np

from minitensor.autograd import no_grad
from minitensor.data.addition import VOCAB as ADDITION_VOCAB
from minitensor.data.addition import AdditionTask
from minitensor.data.mlm import mask_tokens
from minitensor.tensor import Tensor

VOCAB = ADDITION_VOCAB + "_"  # "_" is [MASK]
MASK = VOCAB.index("_")
SEP = VOCAB.index("=")
DIGITS = np.arange(10)


class MaskedAdditionTask(AdditionTask):
    """`AdditionTask`'s problems as MLM batches: `get_batch` gives (inputs, labels), int64
    (batch_size, block_size) with labels -100 where nothing is to be predicted."""

    vocab = VOCAB
    vocab_size = len(VOCAB)

    def __init__(self, digits=2, heldout_fraction=0.1, seed=0, mask_prob=0.15):
        super().__init__(digits, heldout_fraction, seed)
        self.mask_prob = mask_prob
        self.block_size = self.prompt_length + self.answer_length  # the whole problem is the input

    def get_batch(self, batch_size, split="train", generator=None):
        rng = generator if generator is not None else self.generator
        seq = self.sequences(*self.problems(batch_size, split, rng))
        return mask_tokens(seq, rng, MASK, seq < 10, DIGITS, self.mask_prob)


@no_grad()
def masked_digit_accuracy(model, task, num_problems=1000, seed=0):
    """Fraction of `num_problems` held-out problems, each with ONE digit (drawn uniformly) replaced
    by [MASK], whose masked digit the model's argmax gets right. Chance is 10%."""
    rng = np.random.default_rng(seed)
    seq = task.sequences(*task.problems(num_problems, "heldout", rng))
    rows = np.arange(len(seq))
    where = np.array([rng.choice(np.flatnonzero(row < 10)) for row in seq])
    inputs = seq.copy()
    inputs[rows, where] = MASK
    was_training = model.training
    model.eval()
    try:
        logits, _ = model(inputs)
    finally:
        model.train(was_training)
    logits = logits.data if isinstance(logits, Tensor) else logits
    return float((logits[rows, where].argmax(axis=-1) == seq[rows, where]).mean())
