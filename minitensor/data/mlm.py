"""The masked-language-model input rule of BERT (Devlin et al. 2019, section 3.1).

Of the tokens that may be masked, a fixed share `mask_prob` (15%) per sequence is chosen
for prediction; each chosen token is then

    80%  replaced by the [MASK] token        (the model must infer it from the context)
    10%  replaced by a random token          (so it cannot trust every visible token)
    10%  left unchanged                      (so it also learns the visible token's own vector)

The labels are the original tokens at the chosen positions and `IGNORE_INDEX` (-100)
everywhere else, so the cross-entropy counts the chosen positions only.

Each sequence gets the same NUMBER of chosen tokens, max(1, round(mask_prob · n)) of its
n maskable ones, as Google's `create_pretraining_data.py` does (and not a Bernoulli draw
per token). That is why every layout equals one device: the loss is a mean over labelled
tokens, and when every row has as many labels, the mean over a micro-batch or a dp shard's
rows, averaged over them, is the mean over the global batch.

The rule is a pure function of (ids, generator): the training job draws the generator
from (seed, step), so every rank of a layout masks the global batch identically.
"""
import numpy as np

IGNORE_INDEX = -100


def mask_tokens(ids, generator, mask_id, maskable, replacements, mask_prob=0.15):
    """(inputs, labels) for MLM from token `ids` (B, T).

    maskable: bool (B, T), the positions that may be chosen (never separators);
    replacements: the token ids a "random token" is drawn from."""
    ids, maskable = np.asarray(ids), np.asarray(maskable, dtype=bool)
    if maskable.shape != ids.shape:
        raise ValueError(f"mask_tokens: maskable {maskable.shape} must have the shape of ids {ids.shape}")
    if not 0.0 < mask_prob <= 1.0:
        raise ValueError(f"mask_tokens: mask_prob must be in (0, 1], got {mask_prob}")
    # exercise 17.1: the 80-10-10 masking rule
    # hint: choose max(1, round(mask_prob · n)) maskable positions per row (rank a uniform draw per position,
    # hint: non-maskable ones last); labels: the original ids there, IGNORE_INDEX elsewhere. Then one uniform u per
    # hint: position: u < 0.8 → mask_id, 0.8 ≤ u < 0.9 → a random id from `replacements`, else unchanged.
    count = np.maximum(1, np.round(mask_prob * maskable.sum(axis=1))).astype(np.int64)
    score = np.where(maskable, generator.random(ids.shape), np.inf)  # non-maskable positions rank last
    rank = np.argsort(np.argsort(score, axis=1, kind="stable"), axis=1)
    chosen = (rank < count[:, None]) & maskable
    labels = np.where(chosen, ids, IGNORE_INDEX)
    u = generator.random(ids.shape)
    random_ids = generator.choice(np.asarray(replacements), size=ids.shape)
    inputs = np.where(chosen & (u < 0.8), mask_id, ids)
    inputs = np.where(chosen & (u >= 0.8) & (u < 0.9), random_ids, inputs)
    return inputs, labels
    # end exercise
