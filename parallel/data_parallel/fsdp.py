"""`FullyShardedDataParallel`: ZeRO-2/3 for any module, as PyTorch's FSDP wraps one.

A DataParallel (its hooks, no_sync, unused parameters) whose reducer reduce-scatters
(reducer.ShardedReducer); under stage 3 the parameters are sharded per unit and gathered
around each use by fully_sharded.py's `Sharding`, and the ZeroOptimizer steps the chunks.
"""
import contextlib

from minitensor.autograd import is_grad_enabled

from .ddp import DataParallel, output_tensors
from .flat_units import gather_grad_shards
from .fully_sharded import Sharding, fully_shard
from .reducer import ShardedReducer
from .zero import ZeroOptimizer


def sharded_units(module, names):
    """[(unit name, trainable parameters)] for the submodules `names`, then "root": the
    trainable parameters of no listed submodule (a parameter two units share must be
    there). Frozen parameters are in no unit: every rank keeps them whole."""
    modules = dict(module.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        raise ValueError(f"units {missing} are not submodules; the submodules are {sorted(n for n in modules if n)}")
    units, claimed = [], {}
    for name in names:
        params = [p for p in modules[name].parameters() if p.requires_grad]
        twice = [claimed[id(p)] for p in params if id(p) in claimed]
        if twice:
            raise ValueError(f"unit {name!r} shares parameters with unit {twice[0]!r}; leave shared parameters "
                             f"to the root unit")
        claimed.update({id(p): name for p in params})
        units.append((name, params))
    root = [p for p in module.parameters() if p.requires_grad and id(p) not in claimed]
    return [(name, params) for name, params in units + [("root", root)] if params]


class FullyShardedDataParallel(DataParallel):
    """ZeRO-2 (`stage=2`, FSDP's SHARD_GRAD_OP) or ZeRO-3 (`stage=3`, FULL_SHARD) over `group`.

    A DataParallel (its hooks, no_sync, unused parameters) whose reducer reduce-scatters.
    Stage 3 also shards the parameters per unit: `units` names submodules (each a unit;
    the rest, e.g. a tied embedding, is the root unit, gathered for the whole forward),
    `prefetch` is how many all-gathers run ahead. `configure_optimizer()` returns the
    ZeroOptimizer that updates the shards; `full_state_dict()`/`full_grads()` the dense view.
    """

    def __init__(self, module, group, stage=3, units=(), prefetch=1, bucket_mb=25):
        if stage not in (2, 3):
            raise ValueError(f"FullyShardedDataParallel: stage={stage!r} is not 2 or 3 (ZeRO-1: ZeroOptimizer)")
        self.stage = stage
        self.units = sharded_units(module, list(units)) if stage == 3 else []
        super().__init__(module, group, bucket_mb)
        self.sharding = None
        if stage == 3:
            names = [name for name, _ in self.units]
            self.sharding = Sharding(names[::-1], self.reducer.buckets, prefetch, names[-1:] + names[:-1]
                                     if names[-1] == "root" else names)
            by_name = {unit.name: unit for unit in self.sharding.units}
            modules = dict(module.named_modules())
            for name in units:
                fully_shard(modules[name], self.sharding, by_name[name])
            fully_shard(module, self.sharding, by_name.get("root"))

    def make_reducer(self, trainable, bucket_mb):
        if self.stage == 2:
            return ShardedReducer(trainable[::-1], self.group, bucket_mb)
        return ShardedReducer(trainable, self.group, param_lists=[params for _, params in self.units[::-1]])

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        if self.sharding is not None and is_grad_enabled():
            self.sharding.mark_unreached([t for t in output_tensors(output) if t.requires_grad])
        return output

    __call__ = forward

    def reduce_buckets(self):
        if self.sharding is not None:
            self.sharding.finish()  # every backward gather issued before waiting for the reduce-scatters
        super().reduce_buckets()

    def configure_optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, moment_dtype=None):
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        return ZeroOptimizer(trainable, self.group, lr, betas, eps, weight_decay, self.stage, self.reducer.buckets,
                             moment_dtype=moment_dtype)

    def full_parameters(self, writeback=False):
        return self.sharding.full_parameters(writeback) if self.sharding else contextlib.nullcontext()

    def full_state_dict(self):
        with self.full_parameters():
            return {name: p.data.copy() for name, p in self.module.named_parameters()}

    def full_grads(self):
        """Every trainable parameter's averaged gradient, by name (collective; after the sync)."""
        grads = gather_grad_shards(self.reducer.buckets)
        return {name: grads[id(p)] for name, p in self.module.named_parameters() if id(p) in grads}
