"""The composition root: every axis put together on one model.

    parallel_model.py   ParallelModel: the names checkpoints and the job call on any parallel model
    gpt.py              HybridGPT: dp × tp × pp × cp (× ep) over a Mesh, any ZeRO stage, a precision policy
    zero_units.py       UnitShards: HybridGPT's ZeRO-2/3 units, reduce-scattered during backward
    experts.py          a mixture of experts' parameters: replicated over edp, their gradients reduced there

Nothing here is new mechanism: each axis lives in its own package (data_parallel,
tensor_parallel, pipeline, context_parallel, expert_parallel), and only this package imports them all.
"""
from .gpt import HybridGPT
from .parallel_model import ParallelModel
from .zero_units import UnitShards

__all__ = ["HybridGPT", "ParallelModel", "UnitShards"]
