"""Strategy planner: a pure cost model of memory and step time for dp × tp × pp layouts.

    >>> from parallel.plan import get_config, Layout, estimate, load_profile
    >>> est = estimate(get_config("medium"), Layout(dp=2, tp=2, micro_batches=2), batch=32,
    ...                profile=load_profile("laptop-cpu"))

Run `python -m parallel.plan --help` for the command line.
"""
from .cost import Estimate, estimate
from .layout import PRECISIONS, Layout, rank_coords
from .memory import (
                     activation_bytes_per_rank,
                     block_activation_bytes,
                     memory_per_rank,
                     param_bytes_per_rank,
                     peak_memory,
)
from .model import CONFIGS, GPTConfig, balanced_partition, dense_param_count, get_config, param_count
from .profiles import load_profile
from .search import longest_sequence, plan

__all__ = ["CONFIGS", "Estimate", "GPTConfig", "Layout", "PRECISIONS",
           "activation_bytes_per_rank", "balanced_partition", "block_activation_bytes",
           "dense_param_count", "estimate", "get_config", "load_profile", "memory_per_rank",
           "param_bytes_per_rank", "param_count", "peak_memory", "plan", "longest_sequence",
           "rank_coords"]
