"""Chapter 9, part 1: the rank grid dp × tp × pp, and which ranks talk to which.

    python tutorials/09_3d/mesh_grid.py --threads 8
    mpiexec -n 8 python -m mpi4py tutorials/09_3d/mesh_grid.py [--dp 2 --tp 2 --pp 2] [--ranks-per-node 4]

Prints: Mesh.describe()'s picture of the grid, then every rank's coordinates and the
members of its tp, dp and pp groups — as the groups themselves report them (each
group all-gathers its members' world ranks) — then, per axis, the distinct groups, the
rank distance between neighbours in a group, and how many groups would stay inside
one node if `--ranks-per-node` consecutive ranks shared a node.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
from parallel import Mesh
from parallel.comm import run_on_ranks
from parallel.launch import launch_report, rank_arguments

AXES = ("tp", "dp", "pp")   # fastest-varying first


def group_members(group, world_rank):
    """The world ranks of `group`, in group-rank order: a real all-gather over the group."""
    return group.all_gather(np.array([world_rank], dtype=np.int64))


def main(dp, tp, pp, ranks_per_node):
    world = parallel.world()
    say = print if world.rank == 0 else (lambda *args: None)
    say(launch_report(world))
    mesh = Mesh(dp, tp, pp)
    say(mesh.describe())

    # One row per rank: rank, coordinates, then the members of its tp, dp and pp groups.
    members = {axis: group_members(getattr(mesh, f"{axis}_group"), world.rank) for axis in AXES}
    row = np.concatenate([[world.rank, mesh.dp_rank, mesh.tp_rank, mesh.pp_rank], *(members[axis] for axis in AXES)])
    rows = world.all_gather(row[None, :], axis=0)
    say("\nevery rank, its coordinates and the ranks it talks to in each group:")
    for r, d, t, p, *rest in rows.tolist():
        groups, start = {}, 0
        for axis in AXES:
            size = getattr(mesh, axis)
            groups[axis], start = rest[start:start + size], start + size
        say(f"  rank {r}: dp {d}, tp {t}, pp {p}   tp group {groups['tp']}  dp group {groups['dp']}  "
            f"pp group {groups['pp']}")

    say(f"\nthe groups of each axis (a node = {ranks_per_node} consecutive ranks):")
    for axis in AXES:
        size = getattr(mesh, axis)
        distinct = sorted({tuple(g) for g in world.all_gather(members[axis][None, :], axis=0).tolist()})
        stride = distinct[0][1] - distinct[0][0] if size > 1 else 0
        inside = sum(len({rank // ranks_per_node for rank in g}) == 1 for g in distinct)
        say(f"  {axis}: {len(distinct)} group(s) of {size}: {' '.join(str(list(g)) for g in distinct)}")
        say(f"  {axis} neighbours are {stride} rank(s) apart; groups inside one node: {inside} of {len(distinct)}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=8)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=4,
                        help="consecutive ranks that would share a node (default 4)")
    args = parser.parse_args()
    run_on_ranks(args.threads, main, args.dp, args.tp, args.pp, args.ranks_per_node)
