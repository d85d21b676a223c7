"""Dropout randomness under tensor parallelism (Megatron's model-parallel RNG tracker).

Two kinds of region need two kinds of mask:

* replicated regions (the residual stream without sequence parallelism: embedding,
  attention-output and MLP-output dropout) hold the same activations on every tp rank,
  so every rank must drop the same elements, or the ranks' copies drift apart:
  `replicated` is seeded alike on every tp rank and drawn in the same order;
* sharded regions (the attention probabilities of the rank's own heads; with sequence
  parallelism, the rank's own positions) hold different data on each rank, and their
  masks must be independent: `sharded` is seeded with the tp rank mixed in.

Both are explicit numpy Generators, so a run is deterministic for a given seed and
layout and never disturbs (or depends on) minitensor's default generator.
"""
import contextlib

import numpy as np

from minitensor.random import get_rng_state, set_rng_state


class TensorParallelRNG:
    def __init__(self, seed, tp_rank):
        self.replicated = np.random.default_rng([seed, 0])
        self.sharded = np.random.default_rng([seed, 1, tp_rank])

    def generator(self, sharded):
        return self.sharded if sharded else self.replicated

    def generators(self):
        """Every stream a forward draws from (fork_sharded draws from `sharded` too): what a
        recomputation must replay to draw the same masks (minitensor.recompute's `generators=`)."""
        return (self.replicated, self.sharded)

    @contextlib.contextmanager
    def fork_sharded(self):
        """Run a block whose dropout draws from the default generator (e.g. gpt.attend) on the
        sharded stream instead: swap the states in, and back out afterwards."""
        saved = get_rng_state()
        set_rng_state(self.sharded.bit_generator.state)
        try:
            yield
        finally:
            self.sharded.bit_generator.state = get_rng_state()
            set_rng_state(saved)
