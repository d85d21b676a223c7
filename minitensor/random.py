"""Seeded randomness: the same seed gives bit-identical numbers in every process.

The default generator is per thread, so N ranks running as threads in one process
each draw their own reproducible stream, exactly as N MPI processes would.
"""
import threading

import numpy as np

from minitensor.tensor import DEFAULT_FLOAT

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


def uniform(shape, bound, dtype=DEFAULT_FLOAT, generator=None):
    """U(−bound, bound), drawn in float64 then cast, so every dtype sees the same values."""
    rng = generator if generator is not None else default_generator()
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def normal(shape, std, dtype=DEFAULT_FLOAT, generator=None):
    """N(0, std²), drawn in float64 then cast, like `uniform`."""
    rng = generator if generator is not None else default_generator()
    return (rng.standard_normal(size=shape) * std).astype(dtype)
