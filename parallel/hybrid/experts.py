"""HybridGPT's mixture-of-experts parameters (minitensor.nn.moe) under expert parallelism.

Each rank of an ep group holds E/ep of every MoE layer's experts (expert_parallel:
tokens go to their experts' ranks and back by all-to-all); the ep groups split the dp
ranks, so every expert has dp/ep replicas, the edp group (parallel.mesh).

    dense parameters   (attention, norms, embeddings, routers) replicated over dp × cp:
                       rank 0's copy broadcast at the start, gradients averaged over dp × cp
    expert parameters  replicated over edp: broadcast over edp, gradients summed over edp and
                       divided by dp. A rank's expert gradient already sums what every rank
                       of its ep group sent it, so the edp sum is the sum over all dp ranks'
                       losses, and /dp makes it the gradient of their mean.

Both reductions are the one gradient Reducer (data_parallel.reducer). The single-device
view joins each rank's experts over the ep group (`join_experts`).
"""
from ..comm.gather import gather_named_arrays
from ..data_parallel.ddp import broadcast_parameters
from ..data_parallel.reducer import Reducer


def is_expert(name):
    return ".experts." in name


def split_experts(named):
    """([dense parameters], [expert parameters]) of [(single-device name, parameter)]."""
    return [p for n, p in named if not is_expert(n)], [p for n, p in named if is_expert(n)]


def start_as_one_model(named, mesh):
    """Every replica starts as rank 0's: the dense parameters over dp × cp, the experts over edp."""
    dense, experts = split_experts(named)
    broadcast_parameters(dense, mesh.dp_cp_group)
    broadcast_parameters(experts, mesh.edp_group)


def gradient_reducers(named_masters, mesh):
    """(the dense parameters' Reducer over dp × cp, the experts' over edp, or None without experts)."""
    dense, experts = split_experts([(n, p) for n, p in named_masters if p.requires_grad])
    return (Reducer(dense[::-1], mesh.dp_cp_group),
            Reducer(experts[::-1], mesh.edp_group, divisor=mesh.dp) if experts else None)


def join_experts(local, mesh):
    """{name: array} of this rank with every ep rank's experts joined in (the rest: ep rank 0's)."""
    if mesh.ep == 1:
        return local
    return gather_named_arrays(mesh.ep_group, {name: a for name, a in local.items()
                                               if is_expert(name) or mesh.ep_rank == 0})
