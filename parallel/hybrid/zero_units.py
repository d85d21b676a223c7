"""ZeRO-2/3 inside HybridGPT: the units, their reduce-scatter buckets, and the reduce-scatter
that starts inside backward. Two of the replica synchronisations (replicas.py).

Each pipeline stage is cut into units (stage_units: the token and position embeddings, each
block, ln_f, the lm_head; FSDP's units), and every unit is one bucket per replica section
(sections.py: a mixture of experts' block is a bucket of its dense parameters over dp × cp
and one of its experts over edp), each section's buckets one ShardedReducer, the last
stage's last unit first. ZeRO-2 keeps this rank's chunk of each bucket's gradient; ZeRO-3
also shards the parameters (fully_sharded.py), all-gathered for each micro-batch's forward
and backward (a unit's buckets of other sections are gathered around it too).

A hook on every bucketed parameter counts its gradients in the global batch. After its
m-th (the last micro-batch's backward) the gradient is final, and each next bucket of its
reducer whose parameters are all final starts its non-blocking reduce-scatter, in index
order so every rank of the section's group issues the same sequence: it travels while
backward computes the units before it. A bucket whose gradient still needs a sum over tp
(sequence parallelism's partial LayerNorm gradients) or over the pipeline ends (a tied
embedding) starts only after that sum, after the schedule, and so do the buckets after it.
`after_batch` then finishes every reduce-scatter: the chunks grow, the full gradients are gone.
"""
import contextlib

from ..data_parallel.flat_units import gather_grad_shards, masters_gathered, shard_masters
from ..data_parallel.fully_sharded import Sharding, fully_shard
from ..data_parallel.reducer import ShardedReducer
from ..data_parallel.zero import ZeroOptimizer
from .replicas import ReplicaSync
from .sections import replica_sections, start_as_one_model


class ShardedGradients(ReplicaSync):
    """ZeRO-2: every unit's gradient reduce-scattered over its section's group; this rank keeps
    its chunk (`grad_shard`), and under a mixed policy its chunk of the float32 masters
    (`param_shard`), which the sharded optimizer steps and all-gathers into the parameters."""

    zero = 2

    def __init__(self, parts):
        super().__init__(parts)
        start_as_one_model(self.named_masters, self.mesh)
        self.amp.masters_to_params()
        self.sections = replica_sections(list(zip(self.names, self.amp.params)), self.mesh)  # the masters go to shards
        self.units = [self.stage_buckets(stage) for stage in self.stages]  # per stage: [(name, section, params)]
        # The gradients are reduce-scattered in the masters' dtype (float32 under a mixed policy):
        # a 16-bit sum over n ranks would round n - 1 times and could overflow float16 under loss
        # scaling, and the kept chunk is exactly the float32 master's gradient the optimizer needs.
        lists = {s.name: [params for chunk in self.units for _, name, params in chunk if name == s.name][::-1]
                 for s in self.sections}
        self.reducers = [ShardedReducer([], s.group, divisor=s.divisor, param_lists=lists[s.name],
                                        dtype=self.amp.policy.master_dtype) for s in self.sections]
        for section, reducer in zip(self.sections, self.reducers):
            for bucket in reducer.buckets:
                bucket.section = section.name  # the gathers' group is counted under its name
        if self.amp.mixed:
            shard_masters(self.buckets, {id(p): m for p, m in zip(self.amp.params, self.amp.masters)})
            self.amp.hand_over_masters(lambda: [bucket.grad_shard for bucket in self.buckets])
        self.watch_gradients()

    def stage_buckets(self, stage):
        """[(unit name, section name, trainable parameters)] of a stage, in forward order."""
        section_of = {id(p): s.name for s in self.sections for p in s.params}
        return [(name, section.name, params) for name, module in stage_units(stage) for section in self.sections
                if (params := [p for p in module.parameters() if section_of.get(id(p)) == section.name])]

    def optimizer(self, lr, betas, eps, weight_decay):
        return ZeroOptimizer(self.amp.masters, self.mesh.dp_cp_group, lr, betas, eps, weight_decay, self.zero,
                             self.buckets, moment_dtype=self.amp.policy.moment_dtype)

    def watch_gradients(self):
        """A hook on every bucketed parameter counts its gradients in this global batch's
        backward; a bucket `waits_for_sums` if it holds a parameter whose gradient is still
        summed over tp or the pipeline ends after the schedule."""
        tied = {id(p) for p in self.tied.copies} if self.tied.group is not None else set()
        self.reducer_of = {}
        for reducer in self.reducers:
            for bucket in reducer.buckets:
                bucket.waits_for_sums = any(getattr(p, "tp_partial_grad", False) or id(p) in tied for p in bucket.params)
                for p in bucket.params:
                    self.reducer_of[id(p)] = reducer
                    p.register_post_accumulate_grad_hook(self.on_grad_ready)
        self.accumulated_grads = {}  # id(parameter) -> gradients accumulated in this global batch

    def on_grad_ready(self, p):
        """A parameter's backward of one micro-batch has accumulated into .grad; after its m-th
        (the last micro-batch's) the parameter's gradient is final. Start the reduce-scatter of
        each next bucket of its reducer, in index order, while all its parameters are final."""
        count = self.accumulated_grads[id(p)] = self.accumulated_grads.get(id(p), 0) + 1
        if count > self.microbatches:
            raise RuntimeError(f"a parameter of shape {p.shape} got {count} gradients from {self.microbatches} "
                               "micro-batches: its unit's reduce-scatter has already freed them")
        # exercise 14.3: a unit's reduce-scatter starts in backward, once its gradients are final
        # hint: while the next bucket of p's reducer (self.reducer_of[id(p)]) not yet started (reducer.started)
        # hint: is final (self.bucket_final), start it (reducer.start_next()): in index order, so every rank
        # hint: issues the same sequence.
        reducer = self.reducer_of[id(p)]
        while reducer.started < len(reducer.buckets) and self.bucket_final(reducer.buckets[reducer.started]):
            reducer.start_next()
        # end exercise

    def bucket_final(self, bucket):
        return not bucket.waits_for_sums and all(
            self.accumulated_grads.get(id(p), 0) == self.microbatches for p in bucket.params)

    def after_batch(self):
        """After each global batch's schedule: the tp and tied sums of the gradients still
        whole, every backward gather still due, then every reduce-scatter started (those
        backward did not start) and finished: the chunks grow, the full gradients are gone."""
        for stage in self.stages:
            stage.finish_grad_sync()
        self.tied.finish()
        for sharding in self.shardings:
            sharding.finish()
        for reducer in self.reducers:
            reducer.finish()
        self.accumulated_grads = {}

    def finish(self, accumulated):
        """Each batch's reduce-scatter is done (after_batch): the mean of the chunks over the batches."""
        for bucket in self.buckets:
            bucket.grad_shard /= accumulated

    def zero_grad(self):
        for reducer in self.reducers:
            reducer.zero_grad_shards()

    def full_parameters(self, writeback=False):
        """Under a mixed policy the float32 masters, gathered from the chunks."""
        return masters_gathered(self.buckets, writeback) if self.amp.mixed else contextlib.nullcontext()

    @contextlib.contextmanager
    def whole_grads(self):
        """The averaged gradients, whole, gathered from every rank's chunk, only for the block."""
        grads = gather_grad_shards(self.buckets)
        params = [p for bucket in self.buckets for p in bucket.params]
        for p in params:
            p.grad = grads[id(p)]
        try:
            yield
        finally:
            for p in params:
                p.grad = None

    def held_arrays(self):
        """The gradient chunks; the float32 masters' chunks (optimizer state); ZeRO-3's compute chunks."""
        buckets = self.buckets
        return {"params": [b.compute_shard for b in buckets if b.compute_shard is not None],
                "grads": [b.grad_shard for b in buckets],
                "optim": [b.param_shard for b in buckets if b.param_shard is not None
                          and b.param_shard is not b.compute_shard]}


class ShardedParameters(ShardedGradients):
    """ZeRO-3: ZeRO-2, and each unit's parameters sharded too: one Sharding per stage."""

    zero = 3

    def __init__(self, parts):
        super().__init__(parts)
        bucket_of = {id(b.params[0]): b for b in self.buckets}
        dense = self.sections[0].name  # a unit of another section is named for it: "blocks.1 (edp)"
        self.shardings = [self.shard_parameters(stage, [(name if section == dense else f"{name} ({section})", name,
                                                         bucket_of[id(params[0])]) for name, section, params in chunk])
                          for stage, chunk in zip(self.stages, self.units)]

    def shard_parameters(self, stage, units):
        """The Sharding of one stage's units [(unit name, module name, bucket)]: each module runs
        as a use of its first unit, with its other sections' units and the units of a tied weight
        it reads (BERT's head) gathered around it."""
        sharding = Sharding([name for name, _, _ in units], [bucket for _, _, bucket in units], self.prefetch)
        modules, by_name = dict(stage_units(stage)), {unit.name: unit for unit in sharding.units}
        for module_name, module in modules.items():
            own = [by_name[name] for name, of, _ in units if of == module_name]
            tied = [by_name[name] for name in stage.tied_reads.get(module_name, ()) if name in by_name]
            if own:
                fully_shard(module, sharding, own[0], own[1:] + tied)
        fully_shard(stage, sharding)
        return sharding

    @contextlib.contextmanager
    def full_parameters(self, writeback=False):
        """Every unit gathered from the shards (the float32 masters under a mixed policy)."""
        with contextlib.ExitStack() as stack:
            for sharding in self.shardings:
                stack.enter_context(sharding.full_parameters(writeback))
            yield


def stage_units(stage):
    """[(single-device name, module)] of a pipeline stage's ZeRO-2/3 units, in forward order:
    the model's first parts, the blocks, its last parts (a part both ends hold, once)."""
    first = list(stage.first_parts) if stage.is_first else []
    last = [name for name in stage.last_parts if name not in first] if stage.is_last else []
    blocks = [(f"blocks.{i}", stage.blocks[i]) for i in stage.blocks.indices()]
    return [(name, getattr(stage, name)) for name in first] + blocks + [(name, getattr(stage, name)) for name in last]
