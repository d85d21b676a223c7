"""A built-in task a small GPT learns in minutes: adding two `digits`-digit numbers.

One problem is one fixed-length string of characters from "0123456789+=":

    "054+367=" + "1240"        54 + 367 = 421 → "0421" written reversed → "1240"

Operands are zero-padded to `digits` digits and the sum to `digits + 1`, so every
problem has the same length and no padding token is needed. The answer is written
least-significant digit first: that is the order in which carries are computed,
so each answer digit depends only on digits the model has already seen or written.
(Written most-significant first, the first digit depends on every carry; a small
model learns that far more slowly.)

The model reads the problem and is trained to predict the answer only: the targets
of the prompt positions are `ignore_index` (-100), so they add nothing to the loss.

Which problems are held out is fixed by `seed`: a hash of (a, b, seed) puts a
`heldout_fraction` of all pairs aside, training never draws them, and `exact_match`
scores the model on them with greedy decoding.
"""
import numpy as np

from minitensor.autograd import no_grad
from minitensor.tensor import Tensor

VOCAB = "0123456789+="
PLUS, EQUALS = VOCAB.index("+"), VOCAB.index("=")
IGNORE_INDEX = -100


def recommended_config():
    """Defaults for the main training job (`python -m parallel.train`), float32.

    Learning rate at step t = 1..steps: lr · min(1, t/warmup) · ½(1 + cos(π·t/steps))
    (linear warmup, cosine decay to 0); AdamW betas (0.9, 0.999), no dropout.

    Batch 64, weight decay 0.1, 1000 steps (issue 19). Held-out exact match (1000 problems),
    `--eval-every 50`, seeds 0-3: first 100% at step 650, 450, 550, 750, and 100% at the end
    for every seed. A step of 64 rows costs about half of one of 128 and needs no more steps
    (batch 128 reached its first 100% at 700, 600, 500, 600), so the job takes half the time:
    on this 2-core machine, quiet (one BLAS thread, keep_freed_memory), seed 0 trained in
    32.0 s at batch 64 against 58.2 s at batch 128 (2026-12-03, back to back), and seeds
    0-3 in 30.3, 28.2, 32.6 and 30.7 s, each to 100% (later the same day 25.9-27.1 s, and
    27.8-32.3 s an hour after that: the machine's own speed drifts by ±15%). Seeds 4-7 also
    end at 100% (first at 700, 700, 550, 500). Two BLAS threads gained little (29.6
    against 32.0 s), so the job keeps one (parallel/train/__main__.py says why).
    Tried and rejected (the steps do not depend on the machine's load, so these were run
    beside other jobs): batch 32 (seed 0 ended at 81%); batch 64 with 900 steps (seeds 0-3
    reach 100%, but seeds 4 and 7 end at 98.5% and 99.9%); with 700 steps (seed 0 at
    19%: the cosine schedule decays before it generalises); 600 steps at batch 128 (seeds 0
    and 3 at 13% and 10%); d_model 64 (seeds 0 and 1 at 13% and 11%); weight decay 1.0 (seeds
    0-2 below 11% after 600 steps); lr 2e-3 (seed 0 at 2% and seed 3 at 16% after 500 of 1000
    steps); 3 digits (seeds 1 and 2 below 15% after 1500 steps); lr 3e-3 (seed 1 stalled at
    81%). Without weight decay (1500 steps at batch 128) seed 1 stayed at 99.9% to the end.
    """
    return dict(
        digits=2, n_layer=2, n_head=4, d_model=128, batch_size=64, steps=1000,
        lr=1e-3, warmup=100, weight_decay=0.1, seed=0,
    )


def _mix64(x):
    """splitmix64's finalizer: a fixed, well-scrambled 64-bit hash of each integer."""
    x = np.asarray(x).astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _digits(x, width):
    """(n,) integers → (n, width) decimal digits, most significant first."""
    return x[:, None] // 10 ** np.arange(width - 1, -1, -1, dtype=np.int64) % 10


class AdditionTask:
    """Addition of `digits`-digit numbers as next-character prediction.

    `get_batch(batch_size)` gives `(idx, targets)`, int64 (batch_size, block_size),
    with `targets` the next character on answer positions and -100 elsewhere.
    """

    vocab = VOCAB
    vocab_size = len(VOCAB)

    def __init__(self, digits=3, heldout_fraction=0.1, seed=0):
        if not 1 <= digits <= 9:
            raise ValueError(f"AdditionTask: digits must be in [1, 9], got {digits}")
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"AdditionTask: heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.digits, self.heldout_fraction, self.seed = digits, heldout_fraction, seed
        self.prompt_length = 2 * digits + 2  # "a+b="
        self.answer_length = digits + 1
        self.block_size = self.prompt_length + self.answer_length - 1  # the last character is never an input
        self.generator = np.random.default_rng(seed)

    def encode(self, text):
        unknown = sorted(set(text) - set(self.vocab))
        if unknown:
            raise ValueError(f"{type(self).__name__}.encode: characters {unknown} are not in {self.vocab!r}")
        return np.array([self.vocab.index(c) for c in text], dtype=np.int64)

    def decode(self, ids):
        return "".join(self.vocab[i] for i in np.asarray(ids).reshape(-1))

    def is_heldout(self, a, b):
        """True for the pairs (a, b) set aside for evaluation (elementwise)."""
        key = np.asarray(a, dtype=np.int64) * 10**self.digits + np.asarray(b, dtype=np.int64)
        h = _mix64(_mix64(key) ^ np.uint64(self.seed % 2**64))
        return (h >> np.uint64(11)) * 2.0**-53 < self.heldout_fraction  # top 53 bits as a uniform in [0, 1)

    def problems(self, n, split="train", generator=None):
        """`n` random pairs (a, b) from the "train" or "heldout" side of the split."""
        if split not in ("train", "heldout"):
            raise ValueError(f"AdditionTask.problems: split must be 'train' or 'heldout', got {split!r}")
        rng = generator if generator is not None else self.generator
        a, b = np.empty(0, np.int64), np.empty(0, np.int64)
        while len(a) < n:  # draw uniformly and keep the pairs on the requested side
            da, db = rng.integers(0, 10**self.digits, size=(2, 2 * n))
            keep = self.is_heldout(da, db) == (split == "heldout")
            a, b = np.concatenate([a, da[keep]]), np.concatenate([b, db[keep]])
        return a[:n], b[:n]

    def sequences(self, a, b):
        """Full problems "a+b=" + reversed sum as (n, block_size + 1) character ids."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        column = np.full((len(a), 1), 0, dtype=np.int64)
        return np.concatenate([
            _digits(a, self.digits), column + PLUS, _digits(b, self.digits), column + EQUALS,
            _digits(a + b, self.answer_length)[:, ::-1],
        ], axis=1)

    def get_batch(self, batch_size, split="train", generator=None):
        seq = self.sequences(*self.problems(batch_size, split, generator))
        idx, targets = seq[:, :-1], seq[:, 1:].copy()
        targets[:, : self.prompt_length - 1] = IGNORE_INDEX  # predict the answer characters only
        return idx, targets


@no_grad()
def greedy_answers(model, prompts, n_tokens):
    """Extend `prompts` (n, T) by `n_tokens` argmax tokens; return just the new ones.

    `model(idx)` may return logits or `(logits, loss)`, as a Tensor or an array.
    """
    idx = np.asarray(prompts)
    for _ in range(n_tokens):
        out = model(idx)
        logits = out[0] if isinstance(out, tuple) else out
        logits = logits.data if isinstance(logits, Tensor) else np.asarray(logits)
        idx = np.concatenate([idx, logits[:, -1].argmax(axis=-1)[:, None]], axis=1)
    return idx[:, -n_tokens:]


def exact_match(model, task, num_problems=1000, seed=0):
    """Fraction of `num_problems` held-out problems whose whole answer the model gets right.

    The problems are fixed by `seed`; decoding is greedy; the model is put in eval
    mode for the call (dropout off) and returned to its previous mode.
    """
    a, b = task.problems(num_problems, "heldout", np.random.default_rng(seed))
    seq = task.sequences(a, b)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        answers = greedy_answers(model, seq[:, : task.prompt_length], task.answer_length)
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    return float((answers == seq[:, task.prompt_length:]).all(axis=1).mean())
