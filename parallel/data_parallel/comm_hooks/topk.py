"""Top-k sparsification with error feedback: each rank sends its k largest entries.

Per bucket of d gradient entries, with k = ceil(ratio · d): every rank picks the k
entries of its error-corrected gradient largest in magnitude and all-gathers their
values and int64 indices; each rank then adds every rank's entries into zeros (in rank
order), which is the sum of the sparse gradients. A rank sends k·(itemsize + 8) bytes
instead of d·itemsize: worth it below ratio ≈ itemsize / (itemsize + 8) only, and an
all-gather's volume grows with n where a ring all-reduce's does not. What was not sent
stays in the error (error_feedback.py), exactly: sent and error have disjoint supports.
At ratio 1 every entry is sent: plain data parallelism.
"""
import math

import numpy as np

from .error_feedback import ErrorFeedback


class Done:
    """A request that has already completed (the hook communicated with blocking calls)."""

    def __init__(self, result):
        self.result = result

    def wait(self):
        return self.result


class TopK:
    """A reducer communication hook: the top `ratio` of each bucket's entries, with error feedback."""

    def __init__(self, ratio, error_feedback=True):
        if not 0 < ratio <= 1:
            raise ValueError(f"TopK: ratio={ratio!r} must be in (0, 1]")
        self.ratio, self.error_feedback = ratio, error_feedback
        self.feedback = ErrorFeedback()

    def __repr__(self):
        return f"TopK(ratio={self.ratio:g})"

    def k(self, numel):
        return max(1, math.ceil(self.ratio * numel))

    def __call__(self, group, index, bucket):
        buffer = bucket.buffer
        corrected = (self.feedback.correct(index, buffer) if self.error_feedback else buffer).copy()
        chosen = np.sort(np.argpartition(-np.abs(corrected), self.k(buffer.size) - 1)[:self.k(buffer.size)])
        values = corrected[chosen]
        all_values, all_indices = group.all_gather(values), group.all_gather(chosen.astype(np.int64))
        if self.error_feedback:
            sent = np.zeros_like(corrected)
            sent[chosen] = values
            self.feedback.remember(index, corrected, sent)
        buffer[...] = 0
        for where, what in zip(np.split(all_indices, group.size), np.split(all_values, group.size)):
            buffer[where] += what  # rank order; one rank's indices are distinct
        return Done(buffer)

    def state_dict(self):
        return self.feedback.state_dict()

    def load_state_dict(self, state):
        self.feedback.load_state_dict(state)
