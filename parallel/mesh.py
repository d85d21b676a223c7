"""`Mesh(dp, tp, pp, cp)`: the world's ranks laid out as a 4-D grid, and a group per axis.

The layout is written down here once and used everywhere (Megatron-LM's order):

    rank = pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank

tp is fastest-varying, so a tensor-parallel group is adjacent ranks (on a
cluster: one node, the fastest links); then cp, whose ring passes keys and values
every layer; then dp; pp slowest. With cp = 1 this is the 3-D layout
pp_rank·dp·tp + dp_rank·tp + tp_rank. For dp=2, tp=2, pp=2 on 8 ranks:

    pp stage 0        pp stage 1
          tp0 tp1           tp0 tp1
    dp0     0   1     dp0     4   5
    dp1     2   3     dp1     6   7

tp groups are the rows ({0,1}, {2,3}, ...), dp groups the columns of one stage
({0,2}, {1,3}, ...), pp groups the same cell across stages ({0,4}, {1,5}, ...).
With cp=2 as well (16 ranks), each row holds cp blocks of tp ranks:

    pp stage 0                     pp stage 1
          cp0.tp0 cp0.tp1 cp1.tp0 cp1.tp1        cp0.tp0 cp0.tp1 cp1.tp0 cp1.tp1
    dp0         0       1       2       3    dp0       8       9      10      11
    dp1         4       5       6       7    dp1      12      13      14      15

cp groups join the same tp column of the cp blocks ({0,2}, {1,3}, {4,6}, ...): a
ring over the sequence. Parameters are replicated over dp AND cp (each cp rank
holds all weights, for its own tokens), so gradients are averaged over the dp_cp
group: the ranks of one (tp, pp) cell across dp and cp ({0,2,4,6}, ...); with
cp = 1 it is the dp group itself.

Expert parallelism (ep, dividing dp; Megatron-Core's order) is no new world axis: it
splits each dp group into dp/ep blocks of ep consecutive dp ranks. The ep group is one
block (its ranks exchange tokens by all-to-all; each holds E/ep experts); the expert
data-parallel group (edp) joins the ranks at the same place of every block, which hold
the same experts. For dp = 4, ep = 2 (tp = pp = 1): ep groups {0,1}, {2,3}; edp groups
{0,2}, {1,3}. Under cp > 1 each cp rank has its own ep groups (its tokens are its own)
and edp spans the cp ranks too: every rank of dp × cp holds a replica of some experts,
so an expert's replicas are the edp ranks of every cp rank. With ep = 1 there is no ep
group and edp is the dp × cp group, where every parameter's replicas are.
"""
from collections import namedtuple

from .comm import world as current_world

MeshCoords = namedtuple("MeshCoords", ["dp", "tp", "pp", "cp"])


def rank_of(dp_rank, tp_rank, pp_rank, dp, tp, cp_rank=0, cp=1):
    """The world rank at grid position (dp_rank, tp_rank, pp_rank, cp_rank)."""
    return pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank


def coords_of(rank, dp, tp, cp=1):
    """The grid position (dp_rank, tp_rank, pp_rank, cp_rank) of a world rank: rank_of's inverse."""
    # exercise 09.1: a rank's grid coordinates
    # hint: invert rank = ((pp_rank·dp + dp_rank)·cp + cp_rank)·tp + tp_rank: tp varies fastest, pp slowest.
    return MeshCoords(dp=rank // (tp * cp) % dp, tp=rank % tp, pp=rank // (tp * cp * dp), cp=rank // tp % cp)
    # end exercise


class Mesh:
    def __init__(self, dp=1, tp=1, pp=1, cp=1, world=None, ep=1):
        world = current_world() if world is None else world
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Mesh: {name}={value!r} must be a positive int")
        if dp * tp * pp * cp != world.size:
            axes = f"dp={dp} x tp={tp} x pp={pp}" + (f" x cp={cp}" if cp > 1 else "")
            raise ValueError(f"Mesh: {axes} = {dp * tp * pp * cp} ranks, but the world has {world.size}")
        self.world, self.dp, self.tp, self.pp, self.cp = world, dp, tp, pp, cp
        self.dp_rank, self.tp_rank, self.pp_rank, self.cp_rank = coords_of(world.rank, dp, tp, cp)
        # Ranks that share the other coordinates form the group of an axis.
        # exercise 09.2: the mesh's groups
        # hint: world.split(color, key): ranks with equal colour form a group, ordered by key. An axis's group
        # hint: is the ranks that share the OTHER coordinates; order them by their own coordinate.
        d, t, p, c = self.dp_rank, self.tp_rank, self.pp_rank, self.cp_rank
        self.tp_group = world.split(color=(p * dp + d) * cp + c, key=t)
        self.dp_group = world.split(color=(p * cp + c) * tp + t, key=d)
        self.pp_group = world.split(color=(d * cp + c) * tp + t, key=p)
        self.cp_group = world.split(color=(p * dp + d) * tp + t, key=c)
        # end exercise
        # The ranks holding replicas of the same parameters: dp x cp (the dp group when cp = 1).
        self.dp_cp_group = self.dp_group if cp == 1 else world.split(color=p * tp + t, key=d * cp + c)
        self.split_experts(ep)

    def split_experts(self, ep):
        """ep_group and edp_group (see the module docstring); ep_rank: this rank's place in its ep group."""
        if self.dp % ep:
            raise ValueError(f"Mesh: ep={ep} must divide dp={self.dp}")
        self.ep, self.ep_rank, self.ep_group, self.edp_group = ep, self.dp_rank % ep, None, self.dp_cp_group
        if ep > 1:
            cell, blocks = self.pp_rank * self.tp + self.tp_rank, self.dp // ep
            block = self.dp_rank // ep
            self.ep_group = self.world.split(color=(cell * self.cp + self.cp_rank) * blocks + block, key=self.ep_rank)
            self.edp_group = self.world.split(color=cell * ep + self.ep_rank, key=block * self.cp + self.cp_rank)

    @property
    def coords(self):
        return MeshCoords(self.dp_rank, self.tp_rank, self.pp_rank, self.cp_rank)

    def sizes(self):
        """{"dp": .., "tp": .., "pp": .., "cp": ..}: the mesh's shape."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, **({"ep": self.ep} if self.ep > 1 else {})}

    def rank_of(self, dp_rank, tp_rank, pp_rank, cp_rank=0):
        return rank_of(dp_rank, tp_rank, pp_rank, self.dp, self.tp, cp_rank, self.cp)

    def __repr__(self):
        cp = f", cp={self.cp}" if self.cp > 1 else ""
        cp += f", ep={self.ep}" if self.ep > 1 else ""
        return f"Mesh(dp={self.dp}, tp={self.tp}, pp={self.pp}{cp}) at rank {self.world.rank} {tuple(self.coords)}"

    def describe(self):
        """A text picture of the rank grid: one block per pp stage, rows dp, columns tp
        (under cp > 1: cp blocks of tp columns, labelled cpC.tpT)."""
        columns = [(c, t) for c in range(self.cp) for t in range(self.tp)]
        labels = [f"cp{c}.tp{t}" if self.cp > 1 else f"tp{t}" for c, t in columns]
        width = max(len(str(self.world.size - 1)) + 2, *(len(label) for label in labels)) + 1
        axes = f"dp={self.dp} x tp={self.tp} x pp={self.pp}" + (f" x cp={self.cp}" if self.cp > 1 else "")
        order = "tp fastest, then cp, then dp, then pp" if self.cp > 1 else "tp fastest, then dp, then pp"
        lines = [f"mesh {axes} over {self.world.size} ranks ({order})"]
        for stage in range(self.pp):
            lines.append(f"pp stage {stage}")
            lines.append(" " * 5 + "".join(label.rjust(width) for label in labels))
            for d in range(self.dp):
                cells = "".join(str(self.rank_of(d, t, stage, c)).rjust(width) for c, t in columns)
                lines.append(f"  dp{d}".ljust(5) + cells)
        cp = f", cp {self.cp_rank}" if self.cp > 1 else ""
        lines.append(f"this is rank {self.world.rank}: dp {self.dp_rank}, tp {self.tp_rank}, pp {self.pp_rank}{cp}")
        return "\n".join(lines)
