"""`Mesh(dp, tp, pp)`: the world's ranks laid out as a 3-D grid, and a group per axis.

The layout is written down here once and used everywhere:

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

tp is fastest-varying, so a tensor-parallel group is adjacent ranks (on a
cluster: one node, the fastest links); then dp; pp slowest. For dp=2, tp=2,
pp=2 on 8 ranks:

    pp stage 0        pp stage 1
          tp0 tp1           tp0 tp1
    dp0     0   1     dp0     4   5
    dp1     2   3     dp1     6   7

tp groups are the rows ({0,1}, {2,3}, ...), dp groups the columns of one stage
({0,2}, {1,3}, ...), pp groups the same cell across stages ({0,4}, {1,5}, ...).
"""
from collections import namedtuple

from .comm import world as current_world

MeshCoords = namedtuple("MeshCoords", ["dp", "tp", "pp"])


def rank_of(dp_rank, tp_rank, pp_rank, dp, tp):
    """The world rank at grid position (dp_rank, tp_rank, pp_rank)."""
    return pp_rank * (dp * tp) + dp_rank * tp + tp_rank


def coords_of(rank, dp, tp):
    """The grid position (dp_rank, tp_rank, pp_rank) of a world rank: rank_of's inverse."""
    # exercise 09.1: a rank's grid coordinates
    # hint: invert rank = pp_rank·dp·tp + dp_rank·tp + tp_rank: tp varies fastest, pp slowest.
    return MeshCoords(dp=rank // tp % dp, tp=rank % tp, pp=rank // (tp * dp))
    # end exercise


class Mesh:
    def __init__(self, dp=1, tp=1, pp=1, world=None):
        world = current_world() if world is None else world
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Mesh: {name}={value!r} must be a positive int")
        if dp * tp * pp != world.size:
            raise ValueError(f"Mesh: dp={dp} x tp={tp} x pp={pp} = {dp * tp * pp} ranks, "
                             f"but the world has {world.size}")
        self.world, self.dp, self.tp, self.pp = world, dp, tp, pp
        self.dp_rank, self.tp_rank, self.pp_rank = coords_of(world.rank, dp, tp)
        # Ranks that share the other two coordinates form the group of an axis.
        # exercise 09.2: the mesh's groups
        # hint: world.split(color, key): ranks with equal colour form a group, ordered by key. An axis's group
        # hint: is the ranks that share the OTHER two coordinates; order them by their own coordinate.
        self.tp_group = world.split(color=self.pp_rank * dp + self.dp_rank, key=self.tp_rank)
        self.dp_group = world.split(color=self.pp_rank * tp + self.tp_rank, key=self.dp_rank)
        self.pp_group = world.split(color=self.dp_rank * tp + self.tp_rank, key=self.pp_rank)
        # end exercise

    @property
    def coords(self):
        return MeshCoords(self.dp_rank, self.tp_rank, self.pp_rank)

    def sizes(self):
        """{"dp": .., "tp": .., "pp": ..}: the mesh's shape."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp}

    def rank_of(self, dp_rank, tp_rank, pp_rank):
        return rank_of(dp_rank, tp_rank, pp_rank, self.dp, self.tp)

    def __repr__(self):
        return f"Mesh(dp={self.dp}, tp={self.tp}, pp={self.pp}) at rank {self.world.rank} {tuple(self.coords)}"

    def describe(self):
        """A text picture of the rank grid: one block per pp stage, rows dp, columns tp."""
        width = len(str(self.world.size - 1)) + 3
        lines = [f"mesh dp={self.dp} x tp={self.tp} x pp={self.pp} over {self.world.size} ranks "
                 f"(tp fastest, then dp, then pp)"]
        for stage in range(self.pp):
            lines.append(f"pp stage {stage}")
            lines.append(" " * 5 + "".join(f"tp{t}".rjust(width) for t in range(self.tp)))
            for d in range(self.dp):
                cells = "".join(str(self.rank_of(d, t, stage)).rjust(width) for t in range(self.tp))
                lines.append(f"  dp{d}".ljust(5) + cells)
        dp_rank, tp_rank, pp_rank = self.coords
        lines.append(f"this is rank {self.world.rank}: dp {dp_rank}, tp {tp_rank}, pp {pp_rank}")
        return "\n".join(lines)
