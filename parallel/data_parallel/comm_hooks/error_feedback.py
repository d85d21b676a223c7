"""Error feedback: what a compressor could not send this step is added to the next step's gradient.

    corrected = gradient + old error       (this rank's, per bucket)
    sent      = decompress(compress(corrected))
    nothing is lost:  gradient + old error == sent + new error   (the new error follows)

Without it a biased compressor (top-k drops the small entries, sign keeps one magnitude)
loses the same information every step, and training stalls or drifts; with it every
coordinate is eventually sent, late rather than never (Seide et al. 2014; Karimireddy
et al. 2019; Stich et al. 2018).
"""
import numpy as np


class ErrorFeedback:
    """Per-bucket error memory of one rank (zeros until the first compressed step)."""

    def __init__(self):
        self.errors = {}  # bucket index -> flat array, the bucket buffer's layout

    def correct(self, index, buffer):
        """buffer += this bucket's error, in place: the gradient the compressor must send."""
        error = self.errors.get(index)
        if error is not None:
            buffer += error
        return buffer

    def remember(self, index, corrected, sent):
        """Keep what `sent` (this rank's share, as the receivers decode it) left out of `corrected`."""
        # exercise 12.1: error feedback
        # hint: choose the new error so that nothing is lost: the module docstring's invariant, solved for it.
        self.errors[index] = corrected - sent
        # end exercise

    def state_dict(self):
        return {f"error.{index}": error.copy() for index, error in self.errors.items()}

    def load_state_dict(self, state):
        self.errors = {int(key.split(".")[1]): np.array(value) for key, value in state.items()
                       if key.startswith("error.")}
