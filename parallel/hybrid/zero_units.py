"""ZeRO-2/3 inside HybridGPT: the units, their reduce-scatter buckets, and the reduce-scatter
that starts inside backward.

Each pipeline stage is cut into units (stage_units: the token and position embeddings, each
block, ln_f, the lm_head; FSDP's units), and every unit is one bucket of the ShardedReducer
over dp × cp, the last stage's last unit first. ZeRO-2 keeps this rank's chunk of each
unit's gradient; ZeRO-3 also shards the unit's parameters (fully_sharded.py), all-gathered
for each micro-batch's forward and backward.

A hook on every bucketed parameter counts its gradients in the global batch. After its
m-th (the last micro-batch's backward) the gradient is final, and each next bucket whose
parameters are all final starts its non-blocking reduce-scatter, in index order so every
rank issues the same sequence: it travels while backward computes the units before it.
A unit whose gradient still needs a sum over tp (sequence parallelism's partial LayerNorm
gradients) or over the pipeline ends (a tied embedding) starts only after that sum, after
the schedule, and so do the units after it. `finish_batch` then finishes every
reduce-scatter: the chunks grow, the full gradients are gone.
"""
from ..data_parallel.flat_units import shard_masters
from ..data_parallel.fully_sharded import Sharding, fully_shard
from ..data_parallel.reducer import ShardedReducer


class UnitShards:
    """The ZeRO-2/3 units of this rank's `stages`; `reducer` (the ShardedReducer of their
    buckets) and `shardings` (ZeRO-3: one Sharding per stage; ZeRO-2: none) are what
    HybridGPT's optimizer, checkpoints and memory figures read. Under a mixed policy the
    buckets keep the float32 masters' chunks (`amp` hands them over)."""

    def __init__(self, stages, mesh, amp, tied, microbatches, zero, prefetch):
        self.microbatches = microbatches
        units = [[(name, [p for p in module.parameters() if p.requires_grad]) for name, module in stage_units(stage)]
                 for stage in stages]
        units = [[(name, params) for name, params in chunk if params] for chunk in units]
        # The gradients are reduce-scattered in the masters' dtype (float32 under a mixed policy):
        # a 16-bit sum over n ranks would round n - 1 times and could overflow float16 under loss
        # scaling, and the kept chunk is exactly the float32 master's gradient the optimizer needs.
        self.reducer = ShardedReducer([], mesh.dp_cp_group,
                                      param_lists=[params for chunk in units for _, params in chunk][::-1],
                                      dtype=amp.policy.master_dtype)
        if amp.mixed:
            shard_masters(self.reducer.buckets, {id(p): m for p, m in zip(amp.params, amp.masters)}, mesh.dp_cp_group)
            amp.hand_over_masters(lambda: [bucket.grad_shard for bucket in self.reducer.buckets])
        self.stages, self.tied = stages, tied
        self.watch_gradients()
        self.shardings = [self.shard_parameters(stage, chunk, mesh, prefetch)
                          for stage, chunk in zip(stages, self.units_buckets(units))] if zero == 3 else []

    def units_buckets(self, units):
        """Each stage's [(name, bucket)] in forward order (the buckets were made last unit first)."""
        buckets, per_stage = self.reducer.buckets[::-1], []
        for chunk in units:
            per_stage.append([(name, bucket) for (name, _), bucket in zip(chunk, buckets)])
            buckets = buckets[len(chunk):]
        return per_stage

    @staticmethod
    def shard_parameters(stage, chunk, mesh, prefetch):
        """ZeRO-3: the Sharding of one stage's units; a unit reading a tied unit's weight
        (BERT's head) gathers it too."""
        sharding = Sharding([name for name, _ in chunk], [bucket for _, bucket in chunk], mesh.dp_cp_group, prefetch)
        modules, by_name = dict(stage_units(stage)), {unit.name: unit for unit in sharding.units}
        for unit in sharding.units:
            reads = [by_name[name] for name in stage.tied_reads.get(unit.name, ()) if name in by_name]
            fully_shard(modules[unit.name], sharding, unit, reads)
        fully_shard(stage, sharding)
        return sharding

    def watch_gradients(self):
        """A hook on every bucketed parameter counts its gradients in this global batch's
        backward; `waits_for_sums[i]`: bucket i holds a parameter whose gradient is still
        summed over tp or the pipeline ends after the schedule."""
        tied = {id(p) for p in self.tied.copies} if self.tied.group is not None else set()
        self.waits_for_sums = [any(getattr(p, "tp_partial_grad", False) or id(p) in tied for p in bucket.params)
                               for bucket in self.reducer.buckets]
        self.accumulated_grads = {}  # id(parameter) -> gradients accumulated in this global batch
        for bucket in self.reducer.buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def on_grad_ready(self, p):
        """A parameter's backward of one micro-batch has accumulated into .grad; after its m-th
        (the last micro-batch's) the parameter's gradient is final. Start the reduce-scatter of
        each next bucket, in index order, while all its parameters are final."""
        count = self.accumulated_grads[id(p)] = self.accumulated_grads.get(id(p), 0) + 1
        if count > self.microbatches:
            raise RuntimeError(f"a parameter of shape {p.shape} got {count} gradients from {self.microbatches} "
                               "micro-batches: its unit's reduce-scatter has already freed them")
        # exercise 14.3: a unit's reduce-scatter starts in backward, once its gradients are final
        # hint: while the next bucket not yet started (self.reducer.started) is final (self.bucket_final),
        # hint: start it (self.reducer.start_next()): in index order, so every rank issues the same sequence.
        reducer = self.reducer
        while reducer.started < len(reducer.buckets) and self.bucket_final(reducer.started):
            reducer.start_next()
        # end exercise

    def bucket_final(self, index):
        return not self.waits_for_sums[index] and all(
            self.accumulated_grads.get(id(p), 0) == self.microbatches for p in self.reducer.buckets[index].params)

    def finish_batch(self):
        """After each global batch's schedule: the tp and tied sums of the gradients still
        whole, every backward gather still due, then every reduce-scatter started (those
        backward did not start) and finished: the chunks grow, the full gradients are gone."""
        for stage in self.stages:
            stage.finish_grad_sync()
        self.tied.finish()
        for sharding in self.shardings:
            sharding.finish()
        self.reducer.finish()
        self.accumulated_grads = {}


def stage_units(stage):
    """[(single-device name, module)] of a pipeline stage's ZeRO-2/3 units, in forward order:
    the model's first parts, the blocks, its last parts (a part both ends hold, once)."""
    first = list(stage.first_parts) if stage.is_first else []
    last = [name for name in stage.last_parts if name not in first] if stage.is_last else []
    blocks = [(f"blocks.{i}", stage.blocks[i]) for i in stage.blocks.indices()]
    return [(name, getattr(stage, name)) for name in first] + blocks + [(name, getattr(stage, name)) for name in last]
