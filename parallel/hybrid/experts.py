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


def dense_replicas(mesh):
    """(the group of a dense parameter's replicas, the divisor of its gradients' sum): dp × cp, their mean."""
    return mesh.dp_cp_group, mesh.dp_cp_group.size


def expert_replicas(mesh):
    """The same for an expert's: the edp group, divided by dp (see the module docstring)."""
    return mesh.edp_group, mesh.dp


def replica_sections(named_masters, mesh):
    """[(parameters, group, divisor)] of the trainable parameters, dense and experts: the
    gradient reducers and ZeRO-1's flat vectors (data_parallel.zero) are cut along these."""
    dense, experts = split_experts([(n, p) for n, p in named_masters if p.requires_grad])
    return [(dense, *dense_replicas(mesh)), (experts, *expert_replicas(mesh))]


def gradient_reducers(named_masters, mesh):
    """(the dense parameters' Reducer over dp × cp, the experts' over edp, or None without experts)."""
    (dense, group, _), (experts, expert_group, divisor) = replica_sections(named_masters, mesh)
    return Reducer(dense[::-1], group), Reducer(experts[::-1], expert_group, divisor=divisor) if experts else None


def mean_over_replicas(name, grad, mesh):
    """A raw local gradient (ZeRO-1 keeps them so) reduced as its parameter's replicas reduce it."""
    group, divisor = expert_replicas(mesh) if is_expert(name) else dense_replicas(mesh)
    return group.all_reduce(grad) / divisor


def join_experts(local, mesh):
    """{name: array} of this rank with every ep rank's experts joined in (the rest: ep rank 0's)."""
    if mesh.ep == 1:
        return local
    return gather_named_arrays(mesh.ep_group, {name: a for name, a in local.items()
                                               if is_expert(name) or mesh.ep_rank == 0})
