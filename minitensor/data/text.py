"""Char-level language modelling on any text: every distinct character is a token."""
import numpy as np


class CharDataset:
    """A text as one long sequence of character ids, served as random (B, T) windows.

    `get_batch` returns `(idx, targets)`, int64 arrays of shape (batch_size, block_size)
    where `targets` is `idx` shifted left by one: each position predicts the next
    character. Batches come from `generator`, or from the dataset's own generator
    seeded with `seed`, so a run is reproducible.
    """

    def __init__(self, text, block_size, seed=0):
        if not isinstance(text, str):
            raise TypeError(f"CharDataset: text must be a str, got {type(text).__name__}")
        if block_size < 1:
            raise ValueError(f"CharDataset: block_size must be ≥ 1, got {block_size}")
        if len(text) <= block_size:
            raise ValueError(f"CharDataset: text of {len(text)} characters is too short for "
                             f"block_size {block_size} (need at least {block_size + 1})")
        self.block_size = block_size
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.data = self.encode(text)
        self.generator = np.random.default_rng(seed)

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"CharDataset.encode: characters {unknown} are not in the vocabulary")
        return np.array([self.stoi[c] for c in text], dtype=np.int64)

    def decode(self, ids):
        return "".join(self.chars[i] for i in np.asarray(ids).reshape(-1))

    def get_batch(self, batch_size, generator=None):
        rng = generator if generator is not None else self.generator
        starts = rng.integers(0, len(self.data) - self.block_size, size=batch_size)
        window = starts[:, None] + np.arange(self.block_size)
        return self.data[window], self.data[window + 1]
