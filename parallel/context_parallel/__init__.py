"""Context parallelism: the sequence split across the cp group, attention as a ring.

    layout.py           which tokens each rank holds (zigzag, contiguous); the work and
                        communication formulas
    ring_attention.py   RingAttention: K/V around the ring, the log-sum-exp merge, its backward
    ulysses.py          the all-to-all alternative (DeepSpeed-Ulysses): split heads, not keys
    context.py          ContextParallel: the group, layout and comm type as the model uses them
"""
from .context import COMM_TYPES, ContextParallel
from .layout import (
    LAYOUTS,
    all_to_all_elements,
    attention_work,
    check_sequence_length,
    ring_elements,
    token_positions,
)
from .ring_attention import RingAttention, block_attention, merge_partial

__all__ = ["ContextParallel", "RingAttention", "LAYOUTS", "COMM_TYPES", "attention_work", "check_sequence_length",
           "ring_elements", "all_to_all_elements", "token_positions", "block_attention", "merge_partial"]
