"""Expert parallelism: each rank of an ep group holds E/ep experts; tokens travel to their
experts and back by two all-to-alls (dispatch.py)."""
from .dispatch import AllToAll, AllToAllDispatcher, all_to_all, expert_major_order, shard_experts

__all__ = ["AllToAll", "AllToAllDispatcher", "all_to_all", "expert_major_order", "shard_experts"]
