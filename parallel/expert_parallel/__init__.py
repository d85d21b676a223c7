"""Expert parallelism: each rank of an ep group holds E/ep experts; tokens travel to their
experts' ranks, one row per (token, rank), and back by two all-to-alls (dispatch.py)."""
from .dispatch import AllToAll, AllToAllDispatcher, all_to_all, shard_experts

__all__ = ["AllToAll", "AllToAllDispatcher", "all_to_all", "shard_experts"]
