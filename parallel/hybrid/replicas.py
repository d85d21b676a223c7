"""Replica synchronisation: how the replicas of a model agree, chosen once when it is built.

Every rank of a replica section (sections.py: dp × cp, and a mixture of experts' edp) holds a
copy of the same parameters and computes gradients on its own data. One object decides
how they become one model again, behind one small interface that HybridGPT calls:

    optimizer(masters, lr, ...)    the optimizer that steps this rank's masters (or shards), its
                                   moments in the policy's dtype (amp.policy.moment_dtype)
    after_batch()                  after each global batch's schedule
    finish(accumulated)            the gradients of `accumulated` batches reduced, ready to step
    after_step(stepped)            after the optimizer step; True if it moved the masters again
    zero_grad()                    drop what it holds of the gradients
    full_parameters(writeback)     a context in which every parameter holds its whole values
    whole_grads()                  a context in which every .grad holds its local whole gradient
    reduce_local(name, grad)       a gradient held only locally, reduced as its replicas do
    register_comm_hook(hook), configure_local_sgd(...)   or a ValueError saying why not
    held_arrays()                  {"params", "grads", "optim"}: arrays it holds besides the model's
    reducers, shardings            the bucketed reducers (their spans are timeline events) and ZeRO-3's units

The ways, one class each (REPLICA_SYNCS, by ZeRO stage):

    0  AllReduceReplicas   the gradients all-reduced per bucket, one reducer per section; a
                           communication hook or local SGD (DiLoCo) replaces the all-reduce
    1  ShardedMoments      ZeRO-1: the optimizer reduce-scatters, steps 1/n of the moments,
                           all-gathers (data_parallel.zero), one flat vector per section
    2  ShardedUnits        ZeRO-2: + each unit's gradient reduce-scattered inside backward
    3  ShardedUnits        ZeRO-3: + each unit's parameters sharded (zero_units.py)

Before any of them: the tensor-parallel partial sums over tp, the tied embedding's copies
over the pipeline's ends, and the mean over accumulated batches into the masters
(`sum_within_replica`): what makes one rank's gradient that of its replica.
"""
import contextlib
from collections import namedtuple

from minitensor.optim import AdamW

from ..data_parallel.local_sgd import DiLoCo
from ..data_parallel.reducer import Reducer
from ..data_parallel.zero import ZeroOptimizer
from .sections import mean_over_replicas, replica_sections, start_as_one_model

# What a replica synchronisation works on: this rank's pipeline stages, the tied embedding's
# TiedGradients, the MixedPrecision, the Mesh, the single-device names of amp.params (in
# order), the micro-batches per global batch, and ZeRO-3's prefetch depth.
ModelParts = namedtuple("ModelParts", ["stages", "tied", "amp", "mesh", "names", "microbatches", "prefetch"])


class ReplicaSync:
    """What every way shares (module docstring)."""

    zero = 0  # the ZeRO stage it is (the layout's "zero")
    comm_hook = outer = None  # the dp gradient compressor, local SGD's outer optimizer (checkpointed per rank)

    def __init__(self, parts):
        self.stages, self.tied, self.amp, self.mesh = parts.stages, parts.tied, parts.amp, parts.mesh
        self.microbatches, self.prefetch = parts.microbatches, parts.prefetch
        self.names = parts.names
        self.sections = replica_sections(self.named_masters, self.mesh)  # the optimizer steps the masters
        self.reducers, self.shardings = [], []

    @property
    def named_masters(self):
        """[(name, master)]: looked up afresh, since ZeRO-2/3 hand the whole masters over to shards."""
        return list(zip(self.names, self.amp.masters))

    def sum_within_replica(self, accumulated):
        """tp partial sums, tied copies, the mean over the accumulated batches into the masters."""
        for stage in self.stages:
            stage.finish_grad_sync()
        self.tied.finish()
        self.amp.grads_to_master(divisor=accumulated)

    def optimizer(self, lr, betas, eps, weight_decay):
        return AdamW(self.amp.masters, lr, betas, eps, weight_decay, self.amp.policy.moment_dtype)

    def after_batch(self):
        """Nothing to do between batches: the reductions wait for finish()."""

    def finish(self, accumulated):
        raise NotImplementedError

    def after_step(self, stepped):
        return False

    def zero_grad(self):
        """Nothing held beside the parameters' .grad."""

    def full_parameters(self, writeback=False):
        return contextlib.nullcontext()

    def whole_grads(self):
        return contextlib.nullcontext()

    def reduce_local(self, name, grad):
        return grad

    def held_arrays(self):
        return {"params": [], "grads": [], "optim": []}

    @property
    def buckets(self):
        return [bucket for reducer in self.reducers for bucket in reducer.buckets]

    def refuse(self, what):
        raise ValueError(f"{what} replaces the dp all-reduce of whole replicas, which ZeRO-{self.zero} replaces "
                         f"by sharding over dp: use one or the other")

    def register_comm_hook(self, hook):
        self.refuse("a communication hook")

    def configure_local_sgd(self, local_steps, outer_lr=None, outer_momentum=0.9):
        self.refuse("local SGD")


class AllReduceReplicas(ReplicaSync):
    """Plain data parallelism: every section's gradients all-reduced per bucket, last
    parameters first (DataParallel's reducer), and divided by the section's divisor."""

    def __init__(self, parts):
        super().__init__(parts)
        start_as_one_model(self.named_masters, self.mesh)
        self.amp.masters_to_params()
        self.reducers = [Reducer(s.params[::-1], s.group, divisor=s.divisor) for s in self.sections]

    def finish(self, accumulated):
        self.sum_within_replica(accumulated)
        for reducer in self.reducers if self.outer is None else ():  # local SGD: no reduction per step
            reducer.finish()

    def one_reducer(self, what):
        if len(self.reducers) != 1:
            raise ValueError(f"{what} over {len(self.reducers)} groups of replicas "
                             f"({', '.join(s.name for s in self.sections)}): not composed yet")
        return self.reducers[0]

    def register_comm_hook(self, hook):
        """Reduce the gradients through `hook` (parallel.data_parallel.comm_hooks), not a plain all-reduce."""
        self.one_reducer("a communication hook").register_comm_hook(hook)
        self.comm_hook = hook

    def configure_local_sgd(self, local_steps, outer_lr=None, outer_momentum=0.9):
        """Local SGD / DiLoCo (parallel.data_parallel.local_sgd): no reduction per step; every
        `local_steps` optimizer steps the replicas average their pseudo-gradients."""
        if self.mesh.cp > 1:
            raise ValueError(f"local SGD with cp={self.mesh.cp}: the cp ranks of a replica hold parts of one "
                             "gradient, which must be summed every step")
        self.outer = DiLoCo(self.one_reducer("local SGD"), local_steps, outer_lr, outer_momentum)

    def after_step(self, stepped):
        """Every local_steps-th step, the outer step moves the masters: the compute copies follow."""
        synced = stepped and self.outer is not None and self.outer.step()
        if synced:
            self.amp.masters_to_params()
        return synced


class ShardedMoments(ReplicaSync):
    """ZeRO-1: the raw local gradients stay local until the optimizer reduce-scatters each
    section's flat vector over its group (data_parallel.zero)."""

    zero = 1

    def optimizer(self, lr, betas, eps, weight_decay):
        sections = [(s.params, s.group, s.divisor) for s in self.sections]
        optimizer = ZeroOptimizer(self.amp.masters, self.mesh.dp_cp_group, lr, betas, eps, weight_decay,
                                  sections=sections, moment_dtype=self.amp.policy.moment_dtype)
        self.amp.masters_to_params()  # it broadcast each section's rank 0 masters: the compute copies follow
        return optimizer

    def finish(self, accumulated):
        self.sum_within_replica(accumulated)

    def reduce_local(self, name, grad):
        """The replicas' mean, as the optimizer takes it."""
        return mean_over_replicas(name, grad, self.mesh)
