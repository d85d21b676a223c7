"""One candidate training layout, and the numeric precision rules it is costed with.

Rank coordinates are `parallel.Mesh`'s (`mesh.coords_of`): tp ranks adjacent
(fastest-varying), then cp, then dp, then pp.
"""
from dataclasses import dataclass

import numpy as np

from minitensor.amp import POLICIES, PrecisionPolicy, precision_policy
from minitensor.narrow_moments import moment_dtype_of
from minitensor.nn.attention_kernels import KERNELS

from ..mesh import coords_of
from ..pipeline.registry import SCHEDULES as PIPELINE_SCHEDULES
from .dual import DUAL

# The schedules the cost model knows: all but "interleaved" (a Layout has no model chunks; plan.cluster
# costs it), and bidirectional DualPipe, costed by its table-2 formulas (plan.dual).
SCHEDULES = tuple(s for s in PIPELINE_SCHEDULES if s != "interleaved") + tuple(s for s in DUAL if s not in PIPELINE_SCHEDULES)


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter for each stored copy, and per activation element."""
    name: str
    param_bytes: int
    grad_bytes: int
    optim_bytes: int          # AdamW exp_avg + exp_avg_sq (+ fp32 master weights in mixed)
    # (grad_bytes under a mixed policy: the 16-bit gradient + the fp32 master gradient)
    activation_bytes: int
    flops_keys: tuple         # profile peak_flops entries to use, first found wins
    master_bytes: int = 0     # a float32 master weight (minitensor.amp; whole under ZeRO-0/1, 1/R of it under
                              # ZeRO-2/3), counted with the optimizer state
    reduce_bytes: int = 0     # bytes per gradient element the dp reduction moves (0: grad_bytes)
    fp8_flops_keys: tuple = ()  # an FP8 recipe: the peak the blocks' linear products run at (cost.py)

    @property
    def dp_grad_bytes(self):
        return self.reduce_bytes or self.grad_bytes


PRECISIONS = {
    "float32": Precision("float32", 4, 4, 2 * 4, 4, ("float32",)),
    "float64": Precision("float64", 8, 8, 2 * 8, 8, ("float64",)),
    # 16-bit weights and grads, fp32 master copy + two fp32 states: the 2+2+12 = 16 bytes/param rule.
    "mixed": Precision("mixed", 2, 2, 4 + 2 * 4, 2, ("bfloat16", "float16")),
}


BF16_MOMENTS = "+bf16-moments"  # a dtype name's suffix: AdamW's moments in bfloat16 (parallel.train --moment-dtype)


def get_precision(name):
    """A planner dtype name (float32, float64, mixed), or a precision policy (minitensor.amp's
    PrecisionPolicy or its name: fp64, fp32, fp16, bf16), costed as HybridGPT holds it; a name
    ending in BF16_MOMENTS ("bf16+bf16-moments", "float32+bf16-moments") keeps the moments in bfloat16."""
    if isinstance(name, str) and name.endswith(BF16_MOMENTS):
        base = name[:-len(BF16_MOMENTS)]
        if base not in POLICIES and base not in ("float32", "float64"):
            raise ValueError(f"dtype {name!r}: bfloat16 moments need a policy ({', '.join(POLICIES)}) or float32 or "
                             f"float64, not {base!r} (mixed is the paper's 2 + 2 + 12 bytes: give bf16 or fp16)")
        return policy_precision(precision_policy({"float32": "fp32", "float64": "fp64"}.get(base, base),
                                                 moment_dtype="bfloat16"))
    if isinstance(name, PrecisionPolicy) or name in POLICIES:
        return policy_precision(precision_policy(name) if isinstance(name, str) else name)
    if name not in PRECISIONS:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(PRECISIONS)}, or a policy {', '.join(POLICIES)}")
    return PRECISIONS[name]


def policy_precision(policy):
    """Bytes per parameter under `policy` as minitensor.amp keeps them. Mixed (2-byte compute,
    4-byte masters): the paper's 2 + 2 + 12 (16-bit weight and gradient; fp32 master and two
    AdamW moments) plus the 4-byte master gradient the float32 reduction needs (Megatron's
    main_grad): 20. Under ZeRO-1 only the moments are sharded here (the masters stay whole);
    ZeRO-2/3 shard the masters too and keep only the float32 gradient chunk (memory.py).
    Uniform: the dtype's weight, gradient and two moments. The policy's moment_dtype bfloat16
    keeps the two moments in 2 bytes each (minitensor.narrow_moments): the optimizer state beside
    float32 masters goes from 4 + 8 = 12 to 4 + 4 = 8 bytes per parameter. An FP8 recipe keeps the uniform
    policy's bytes (its FP8 operands are cast per product and freed) and runs the blocks'
    linear products at the device's float8 peak: a device without one (an A100) has no FP8."""
    compute, master = np.dtype(policy.compute_dtype).itemsize, np.dtype(policy.master_dtype).itemsize
    moments = 2 * moment_dtype_of(policy.moment_dtype, policy.master_dtype).itemsize  # bfloat16 moments: 2 + 2
    # 16-bit GEMMs run at the device's 16-bit peak; a CPU lists none, and there minitensor
    # multiplies 16-bit matrices in float32 BLAS (minitensor.dtypes): its float32 peak.
    flops = ("bfloat16", "float16", "float32") if policy.mixed else (str(np.dtype(policy.compute_dtype)),)
    if policy.mixed:
        return Precision(policy.name, compute, compute + master, moments, compute, flops, master_bytes=master,
                         reduce_bytes=np.dtype(policy.reduce_dtype).itemsize)
    return Precision(policy.name, master, master, moments, master, flops,
                     fp8_flops_keys=("float8",) if policy.fp8 is not None else ())


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    recompute: bool = False           # full activation recomputation, one recomputed region per block
    sequence_parallel: bool = False
    zero: int = 0                     # ZeRO stage over dp: 1 states, 2 + gradients, 3 + parameters
    schedule: str = "1f1b"
    cp: int = 1                       # context parallel: the sequence split over cp ranks, ring attention
    ep: int = 1                       # expert parallel (a mixture of experts): splits each dp group, E/ep experts per rank
    attention: str = "dense"          # the attention kernel: "dense" keeps the probabilities, "flash" only O and L
    max_ranks: int = None             # device-limited routing: a token's experts on at most M of the ep ranks

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batches", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout.{name} must be a positive int, got {value!r}")
        if self.dp % self.ep:
            raise ValueError(f"Layout: ep={self.ep} must divide dp={self.dp}, as parallel.Mesh's")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} must be one of {SCHEDULES}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        if self.max_ranks is not None and not 1 <= self.max_ranks <= self.ep:
            raise ValueError(f"Layout: max_ranks={self.max_ranks} must be in [1, ep={self.ep}]")
        if self.attention not in KERNELS:
            raise ValueError(f"Layout.attention={self.attention!r} must be one of {KERNELS}")

    @property
    def world_size(self):
        return self.dp * self.tp * self.pp * self.cp

    def name(self):
        return (f"dp{self.dp}·tp{self.tp}·pp{self.pp}" + (f"·cp{self.cp}" if self.cp > 1 else "")
                + (f"·ep{self.ep}" if self.ep > 1 else ""))

    def flags(self):
        names = [("recompute", self.recompute), ("sp", self.sequence_parallel), (f"zero{int(self.zero)}", self.zero),
                 (self.schedule, self.schedule != "1f1b"), ("flash", self.attention == "flash")]
        return ",".join(name for name, on in names if on) or "-"


def rank_coords(layout, rank):
    """(dp_rank, tp_rank, pp_rank, cp_rank) of a global rank, in Mesh order."""
    if not 0 <= rank < layout.world_size:
        raise ValueError(f"rank={rank} out of range for world size {layout.world_size}")
    return tuple(coords_of(rank, layout.dp, layout.tp, layout.cp))
