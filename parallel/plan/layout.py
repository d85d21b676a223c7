"""One candidate training layout, and the numeric precision rules it is costed with.

Rank coordinates are `parallel.Mesh`'s (`mesh.coords_of`): tp ranks adjacent
(fastest-varying), then cp, then dp, then pp.
"""
from dataclasses import dataclass

from ..mesh import coords_of
from ..pipeline.schedules import SCHEDULES as PIPELINE_SCHEDULES

# The schedules the cost model knows: all but "interleaved" (a Layout has no model chunks).
SCHEDULES = tuple(s for s in PIPELINE_SCHEDULES if s != "interleaved")


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter for each stored copy, and per activation element."""
    name: str
    param_bytes: int
    grad_bytes: int
    optim_bytes: int          # AdamW exp_avg + exp_avg_sq (+ fp32 master weights in mixed)
    activation_bytes: int
    flops_keys: tuple         # profile peak_flops entries to use, first found wins


PRECISIONS = {
    "float32": Precision("float32", 4, 4, 2 * 4, 4, ("float32",)),
    "float64": Precision("float64", 8, 8, 2 * 8, 8, ("float64",)),
    # 16-bit weights and grads, fp32 master copy + two fp32 states: the 2+2+12 = 16 bytes/param rule.
    "mixed": Precision("mixed", 2, 2, 4 + 2 * 4, 2, ("bfloat16", "float16")),
}


def get_precision(name):
    if name not in PRECISIONS:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    checkpoint: bool = False          # full activation checkpointing, one checkpoint per block
    sequence_parallel: bool = False
    zero: int = 0                     # ZeRO stage over dp: 1 states, 2 + gradients, 3 + parameters
    schedule: str = "1f1b"
    cp: int = 1                       # context parallel: the sequence split over cp ranks, ring attention

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batches", "cp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout.{name} must be a positive int, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} must be one of {SCHEDULES}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")

    @property
    def world_size(self):
        return self.dp * self.tp * self.pp * self.cp

    def name(self):
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}" + (f"·cp{self.cp}" if self.cp > 1 else "")

    def flags(self):
        names = [("ckpt", self.checkpoint), ("sp", self.sequence_parallel), (f"zero{int(self.zero)}", self.zero),
                 (self.schedule, self.schedule != "1f1b")]
        return ",".join(name for name, on in names if on) or "-"


def rank_coords(layout, rank):
    """(dp_rank, tp_rank, pp_rank, cp_rank) of a global rank, in Mesh order."""
    if not 0 <= rank < layout.world_size:
        raise ValueError(f"rank={rank} out of range for world size {layout.world_size}")
    return tuple(coords_of(rank, layout.dp, layout.tp, layout.cp))
