"""Seeded randomness: the same seed gives bit-identical numbers in every process.

The default generator is per thread, so N ranks running as threads in one process
each draw their own reproducible stream, exactly as N MPI processes would.
"""
import threading

import numpy as np

_state = threading.local()


def manual_seed(seed):
    """Reset this thread's default generator; returns it."""
    _state.generator = np.random.default_rng(seed)
    return _state.generator


def default_generator():
    if not hasattr(_state, "generator"):
        manual_seed(0)
    return _state.generator


def get_rng_state():
    return default_generator().bit_generator.state


def set_rng_state(state):
    default_generator().bit_generator.state = state
