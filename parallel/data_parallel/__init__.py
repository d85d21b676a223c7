"""Data parallelism: n replicas of the model, each on its own rows of the global batch.

    global batch (B, T) ──split over dp──▶ rank r's rows (B/n, T)
    forward, backward   ──on every rank──▶ a gradient of its own rows' mean loss
    reduce              ──over dp────────▶ the mean over ranks: the gradient of the
                                           global batch's mean loss, on every rank
    step                ──every rank─────▶ the same update: the replicas stay equal

What each rank keeps between steps, per ZeRO stage (P parameters, n ranks):

    stage   parameters   gradients   optimizer state    the reduction
      0     P            P           P (AdamW moments)  all-reduce              ddp.py
      1     P            P           P/n                reduce-scatter, then    zero.py
                                                        all-gather the params
      2     P            P/n         P/n                reduce-scatter in       fully_sharded.py,
                                                        backward, per bucket    flat_units.py
      3     P/n          P/n         P/n                + all-gather each unit  gather_order.py,
                                                        per use, then free it   fsdp.py

One gradient reducer serves every stage (reducer.py: flat buckets packed, started during
backward, waited for, unpacked); what travels is its communication hook (comm_hooks/:
PowerSGD, top-k, sign, with error feedback). Two variants change the mathematics on
purpose: local SGD / DiLoCo (local_sgd.py) reduces the parameters every H steps instead of
the gradients every step, and the parameter server (parameter_server.py) lets workers run
on parameters up to s versions stale.

This package imports no other axis (tensor, pipeline, context parallel) and not the job
(tests/test_layers.py): HybridGPT (parallel/hybrid/) composes it with them.
"""
from .ddp import DataParallel, broadcast_parameters
from .fsdp import FullyShardedDataParallel
from .local_sgd import DiLoCo
from .reducer import Bucket, Reducer, ShardedReducer, allreduce_hook
from .zero import ZeroOptimizer

__all__ = ["Bucket", "DataParallel", "DiLoCo", "FullyShardedDataParallel", "Reducer", "ShardedReducer",
           "ZeroOptimizer", "allreduce_hook", "broadcast_parameters"]
