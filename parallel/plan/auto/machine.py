"""The machine a sharding is priced on: tp ranks, their link (α, β) and their compute rate."""
from dataclasses import dataclass

from ..cost import link
from ..layout import get_precision
from ..profiles import load_profile, peak_flops
from .sharding import reshard_seconds

# A training step runs each op's forward once and its backward, about twice the forward's
# FLOPs (a matmul's backward is two matmuls: dX and dW): three forward passes in all.
TRAINING_PASSES = 3


@dataclass(frozen=True)
class Machine:
    tp: int
    alpha: float          # seconds per message
    beta: float           # seconds per byte
    rate: float           # flop/s one rank reaches

    def __post_init__(self):
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"Machine: tp must be a positive int, got {self.tp!r}")
        for name in ("alpha", "beta", "rate"):
            if getattr(self, name) < 0 or (name == "rate" and self.rate == 0):
                raise ValueError(f"Machine: {name}={getattr(self, name)!r} must be positive")

    @classmethod
    def from_profile(cls, profile, tp, dtype="float64"):
        """tp ranks of a planner device profile (a name or a dict): its intra-node link when
        tp fits in a node, and its peak × efficiency for `dtype`."""
        profile = load_profile(profile) if isinstance(profile, str) else profile
        _, alpha, beta = link(profile, 1, tp)
        _, peak = peak_flops(profile, get_precision(dtype))
        return cls(tp, alpha, beta, peak * profile["efficiency"])

    def compute_seconds(self, node, rule):
        """Forward + backward seconds of `node` run by `rule` on one rank."""
        return TRAINING_PASSES * node.flops / self.rate / (self.tp if rule.divided else 1)

    def reshard_seconds(self, source, target, nbytes):
        return reshard_seconds(source, target, nbytes, self.tp, self.alpha, self.beta)
