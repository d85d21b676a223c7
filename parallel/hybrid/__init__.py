"""The composition root: every axis put together on one model.

    parallel_model.py   ParallelModel: the names checkpoints and the job call on any parallel model
    gpt.py              HybridGPT: dp × tp × pp × cp (× ep) over a Mesh, any ZeRO stage, a precision policy
    sections.py         where each parameter's replicas are: dp × cp, or a mixture of experts' edp
    replicas.py         how the replicas synchronise, one class per way, chosen once: all-reduce
                        (with comm hooks, local SGD), ZeRO-1's sharded moments
    zero_units.py       ZeRO-2/3: the units, reduce-scattered during backward, their parameters sharded
    dense_view.py       the single-device view: every rank's shards gathered under the dense names
    accounting.py       what a layout holds and communicates, measured

Nothing here is new mechanism: each axis lives in its own package (data_parallel,
tensor_parallel, pipeline, context_parallel, expert_parallel), and only this package imports them all.
"""
from .gpt import HybridGPT
from .parallel_model import ParallelModel
from .replicas import AllReduceReplicas, ReplicaSync, ShardedMoments
from .zero_units import ShardedGradients, ShardedParameters

__all__ = ["HybridGPT", "ParallelModel", "ReplicaSync", "AllReduceReplicas", "ShardedMoments", "ShardedGradients",
           "ShardedParameters"]
