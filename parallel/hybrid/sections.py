"""Where each parameter's replicas are: the replica sections every way of synchronising cuts along.

A parameter is replicated over the ranks that hold the same copy of it, and its gradient
is reduced there:

    dense parameters   (attention, norms, embeddings, routers) on every rank of dp × cp:
                       the dp_cp group
    expert parameters  (a mixture of experts under expert parallelism, ep > 1: each rank of
                       an ep group holds E/ep experts, parallel.mesh) on the ranks at the
                       same place of every ep group, over dp and cp: the edp group

In both, the sum of the replicas' gradients covers every dp × cp rank's loss once (an
expert's gradient on a rank already sums what each rank of its ep group sent it), so both
divide it by dp × cp: the gradient of the mean loss. With ep = 1 the experts' replicas are
the dense ones' (edp is dp_cp), and there is one section.

The replica synchronisations (replicas.py, zero_units.py) cut their reducers, flat vectors
and units along these sections, whatever makes them differ: they never ask why.
"""
from collections import namedtuple

from ..data_parallel.ddp import broadcast_parameters

# name: "dp" or "edp" (the timeline's bucket events say which); params: in forward order;
# group: the ranks holding replicas of them; divisor: what the sum of their gradients is divided by
ReplicaSection = namedtuple("ReplicaSection", ["name", "params", "group", "divisor"])


def is_expert(name):
    return ".experts." in name


def replica_group(name, mesh):
    """(section name, group) of the replicas of the parameter named `name`."""
    return ("edp", mesh.edp_group) if mesh.ep > 1 and is_expert(name) else ("dp", mesh.dp_cp_group)


def replica_sections(named, mesh):
    """[ReplicaSection] of the trainable parameters of [(single-device name, parameter)]: one per
    group of replicas, none empty, dense first."""
    sections = {}
    for name, p in named:
        if p.requires_grad:
            section, group = replica_group(name, mesh)
            sections.setdefault(section, ReplicaSection(section, [], group, mesh.dp_cp_group.size)).params.append(p)
    return sorted(sections.values(), key=lambda section: section.name != "dp")


def mean_over_replicas(name, grad, mesh):
    """A raw local gradient (ZeRO-1 keeps them so) reduced as its parameter's replicas reduce it."""
    return replica_group(name, mesh)[1].all_reduce(grad) / mesh.dp_cp_group.size


def start_as_one_model(named, mesh):
    """Every replica starts as rank 0's of its group."""
    for name, p in named:
        broadcast_parameters([p], replica_group(name, mesh)[1])
