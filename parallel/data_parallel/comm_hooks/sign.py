"""Sign compression with error feedback: one bit per entry and one scale per tensor.

Every rank sends, for each tensor of the bucket, the signs of its error-corrected
gradient M (1 bit each, packed into int64 words) and one scale, the mean magnitude
‖M‖₁ / d; it stands for scale · sign(M) (sign(0) counts as +), which keeps M's ℓ1 norm.
The bucket's "sum" is Σ_ranks scale_i · sign(M_i): this is the scaled-sign compressor
with error feedback of EF-SignSGD (Karimireddy et al. 2019), averaged over ranks like
1-bit SGD (Seide et al. 2014). (signSGD's majority vote, Bernstein et al. 2018, sends
the same bits but sums only signs; it has no error to feed back, so it is not used.)
Bytes per rank and bucket of d entries in t tensors: (n−1)·(8·ceil(d/64) + itemsize·t)
in two all-gathers, against 2(n−1)/n·itemsize·d for the all-reduce: about n/64 of a
float32 all-reduce (an all-gather's volume grows with n). The error keeps everything
the sign and the shared magnitude lost.
"""
import numpy as np

from .error_feedback import ErrorFeedback
from .topk import Done


def pack_signs(values):
    """The signs of `values` (True for ≥ 0) as int64 words, 64 signs a word."""
    bits = np.packbits(values >= 0)
    padded = np.zeros(-(-bits.size // 8) * 8, np.uint8)
    padded[:bits.size] = bits
    return padded.view(np.int64)


def unpack_signs(words, count):
    """±1.0 for each of the first `count` signs packed in `words`."""
    bits = np.unpackbits(words.view(np.uint8))[:count]
    return 2.0 * bits - 1.0


class SignCompression:
    """A reducer communication hook: scaled signs with error feedback (module docstring)."""

    def __init__(self, error_feedback=True):
        self.error_feedback = error_feedback
        self.feedback = ErrorFeedback()

    def __repr__(self):
        return "SignCompression()"

    def __call__(self, group, index, bucket):
        buffer = bucket.buffer
        corrected = (self.feedback.correct(index, buffer) if self.error_feedback else buffer).copy()
        scales = np.array([np.abs(corrected[where]).mean() for where in bucket.slices], corrected.dtype)
        words = pack_signs(corrected)
        all_words = group.all_gather(words).reshape(group.size, -1)
        all_scales = group.all_gather(scales).reshape(group.size, -1)
        decoded = [self.decode(bucket, w, s, corrected) for w, s in zip(all_words, all_scales)]
        if self.error_feedback:
            self.feedback.remember(index, corrected, decoded[group.rank])
        buffer[...] = 0
        for contribution in decoded:  # rank order
            buffer += contribution
        return Done(buffer)

    @staticmethod
    def decode(bucket, words, scales, like):
        """One rank's message as the flat bucket it stands for: scale · sign, tensor by tensor."""
        out = np.zeros_like(like)
        signs = unpack_signs(words, bucket.numel).astype(like.dtype)
        for where, scale in zip(bucket.slices, scales):
            out[where] = scale * signs[where]
        return out

    def state_dict(self):
        return self.feedback.state_dict()

    def load_state_dict(self, state):
        self.feedback.load_state_dict(state)
