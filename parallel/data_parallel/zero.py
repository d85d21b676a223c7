"""ZeRO (Rajbhandari et al., 2020): AdamW whose moments are sharded across the dp group.
Stage 1 is this file alone; stages 2 and 3 (sharded gradients, sharded parameters) are
`fully_sharded.py`, whose buckets or units this optimizer then updates (below).

Plain data parallelism keeps the two AdamW moments of EVERY parameter on every rank:
n identical copies. ZeRO-1 lays all trainable parameters end to end as one flat vector
(zero-padded to a multiple of n) and gives rank r the r-th of n equal chunks; each rank
keeps moments only for its chunk, 1/n of the optimizer state. One step:

    flat local grads ──reduce-scatter──▶ my chunk of Σ grads, ÷ n   (the averaged gradient)
    my chunk of params ──adamw_update (my chunk of the moments)──▶ updated chunk
    updated chunks ──all-gather──▶ every rank's full, identical parameters

The flat vector and the averaged chunk live only during the step: between steps a rank
holds its parameters, their gradients and 1/n of the moments, nothing else (as DeepSpeed
frees its flat gradient partitions), which is what `param_bytes_per_rank` counts.

A reduce-scatter plus an all-gather move exactly what one all-reduce moves, so ZeRO-1
costs no extra communication. The arithmetic on each element is minitensor's own
`adamw_update`, so the result equals AdamW on the averaged gradients.

Composition: `ZeroOptimizer` owns ALL the data-parallel communication of its
parameters: it broadcasts them from rank 0 at construction and reduces the raw local
gradients itself in `step()`. Use it on the plain model, NOT wrapped in DataParallel
(which would all-reduce the gradients first: still correct, twice the traffic).
Gradient accumulation needs no `no_sync()`: backward never communicates, so run several
backward passes and step once. Stage 1 may shard some parameters over another group
(`sections`): a mixture of experts' experts are replicated over the edp group, not dp, so
their flat vector is cut over edp and their summed gradient divided by dp × cp (hybrid/sections.py). As in DataParallel, frozen parameters are not in the
flat vector (never communicated, never changed), and a trainable parameter without a
gradient contributes zeros, so every rank stays in lockstep.
"""
import numpy as np

from minitensor.narrow_moments import moment_dtype_of
from minitensor.optim import Optimizer, adamw_update

from .ddp import broadcast_parameters
from .reducer import Bucket, padded_length, refresh_compute_shard, values_chunk

STAGES = (1, 2, 3)


def flat_bucket(params, group, divisor):
    """Stage 1's flat vector of `params`, zero-padded to group.size equal chunks; step() divides
    the gradients' sum over `group` by `divisor`. Its buffer is made in step() and dropped at its
    end: nothing flat between steps."""
    bucket = Bucket(params, length=padded_length(sum(p.size for p in params), group.size))
    bucket.shard_size, bucket.group, bucket.divisor, bucket.buffer = bucket.length // group.size, group, divisor, None
    return bucket


class ZeroOptimizer(Optimizer):
    """AdamW with sharded moments over `group` (same arguments as minitensor's AdamW).

    stage 1 (default): `params` as they are; step() reduce-scatters their gradients itself.
    stage 2 / 3: `buckets` are the `ShardedReducer`s' (fully_sharded.py), each cut over its own
    group (one reducer's `group`: the experts' buckets over edp, as stage 1's `sections`), whose grad_shard
    already holds this rank's chunk of the averaged gradient; stage 3's buckets (and stage
    2's under a mixed precision policy) also hold the authoritative `param_shard`, which the
    step updates in place. Each bucket is n equal chunks; this rank's moments are its chunk
    of every bucket, end to end, in bucket order, in the gradients' dtype (float32 when the
    parameters compute in 16 bits: the shards are then the float32 master weights), or in
    `moment_dtype` (AdamW's: "bfloat16" keeps 2 bytes per moment; rounding each element is
    elementwise, so the shards step exactly as one device's AdamW with the same setting)."""

    def __init__(self, params, group, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 stage=1, buckets=None, sections=None, moment_dtype=None):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        if stage not in STAGES:
            raise ValueError(f"ZeroOptimizer: stage={stage!r} is not one of {STAGES}")
        if (stage == 1) != (buckets is None):
            raise ValueError(f"ZeroOptimizer: stage {stage} {'takes no' if stage == 1 else 'needs the'} buckets "
                             f"of a ShardedReducer")
        self.group, self.stage = group, stage
        trainable = [p for p in self.params if p.requires_grad]
        if stage == 1:  # (params, group, divisor): one flat vector each, its chunks over its group
            sections = [s for s in sections or [(trainable, group, group.size)] if s[0]]
            broadcast_parameters([p for p in self.params if not p.requires_grad], group)
            for section_params, section_group, _ in sections:
                broadcast_parameters(section_params, section_group)
            buckets = [flat_bucket(*section) for section in sections]
        self.flat_params = [p for bucket in buckets for p in bucket.params]
        if sorted(map(id, self.flat_params)) != sorted(map(id, trainable)):
            raise ValueError("ZeroOptimizer: the sections must hold every trainable parameter once")
        dtypes = sorted({str(p.dtype) for p in self.flat_params})
        if len(dtypes) != 1:
            raise ValueError(f"ZeroOptimizer needs trainable parameters of one dtype, got {dtypes}")
        self.buckets = buckets
        self.numel = sum(b.numel for b in buckets)
        self.shard_size = sum(b.shard_size for b in buckets)
        ends = np.cumsum([b.shard_size for b in buckets])
        self.state_slices = [slice(end - b.shard_size, end) for b, end in zip(buckets, ends)]
        dtype = moment_dtype_of(moment_dtype, buckets[0].grad_shard.dtype if stage > 1 else self.flat_params[0].dtype)
        self.moment_dtype, self.step_count = moment_dtype, 0
        self.exp_avg = np.zeros(self.shard_size, dtype)
        self.exp_avg_sq = np.zeros(self.shard_size, dtype)

    @property
    def start(self):
        """Stage 1 with one section: where this rank's chunk starts in the flat trainable parameters."""
        return self.group.rank * self.shard_size

    @property
    def shard(self):
        """Stage 1 with one section: this rank's chunk [start, stop) of the flat trainable parameters
        (padding excluded)."""
        return self.start, min(self.start + self.shard_size, self.numel)

    def mine(self, bucket):
        """This rank's chunk of a bucket's flat elements."""
        return slice(bucket.group.rank * bucket.shard_size, (bucket.group.rank + 1) * bucket.shard_size)

    def step(self):
        self.step_count += 1
        d = self.defaults
        for bucket, state in zip(self.buckets, self.state_slices):
            if self.stage == 1:
                bucket.allocate()
                # exercise 04.4: the ZeRO-1 step
                # hint: reduce-scatter the packed gradients over bucket.group and divide by bucket.divisor (its
                # hint: size: the mean); update this rank's chunk of the packed values with adamw_update and its
                # hint: moment shards (self.exp_avg[state], ...); all-gather the chunks back over bucket.group.
                grad_shard = bucket.group.reduce_scatter(bucket.pack()) / bucket.divisor
                param_shard = bucket.pack_values()[self.mine(bucket)].copy()
                adamw_update(param_shard, grad_shard, self.exp_avg[state], self.exp_avg_sq[state], self.step_count,
                             d["lr"], *d["betas"], d["eps"], d["weight_decay"])
                bucket.unpack_values(bucket.group.all_gather(param_shard))
                # end exercise
                bucket.buffer = None  # the flat copy goes with the step (the chunks were locals)
                continue
            param_shard = bucket.param_shard if bucket.param_shard is not None else values_chunk(bucket,
                                                                                                 bucket.group.rank)
            adamw_update(param_shard, bucket.grad_shard, self.exp_avg[state], self.exp_avg_sq[state],
                         self.step_count, d["lr"], *d["betas"], d["eps"], d["weight_decay"])
            self.publish(bucket, param_shard)

    def publish(self, bucket, param_shard):
        """The updated chunk into what the forward reads, rounded to the compute dtype (a no-op
        cast under one dtype): stage 2 all-gathers the rounded chunks into the full parameters
        (16-bit on the wire: the rounding commutes with the gather), stage 3 refreshes the
        16-bit chunk its forward will gather."""
        compute_dtype = bucket.params[0].dtype
        if self.stage == 2:
            bucket.unpack_values(bucket.group.all_gather(param_shard.astype(compute_dtype, copy=False)))
        else:
            refresh_compute_shard(bucket)

    def zero_grad(self):
        super().zero_grad()
        if self.stage > 1:
            for bucket in self.buckets:
                bucket.grad_shard[:] = 0

    def state_arrays(self):
        """This rank's shard of the moments, themselves."""
        return [self.exp_avg, self.exp_avg_sq]

    def stepped_arrays(self):
        """The arrays step() writes: the parameters it holds whole (a ZeRO-3 parameter is a read-only
        placeholder between uses, flat_units.freed_placeholder), the chunks it steps (stage 2/3's
        `param_shard`, where the bucket keeps one), and the moments."""
        params = [p.data for p in self.params if p.data.flags.writeable]
        shards = [b.param_shard for b in self.buckets if self.stage > 1 and b.param_shard is not None]
        return params + shards + self.state_arrays()

    def state_bytes(self):
        """Bytes of optimizer state on THIS rank: ≈ AdamW.state_bytes() / group size."""
        return self.exp_avg.nbytes + self.exp_avg_sq.nbytes

    def state_dict(self):
        """This rank's shard of the state (each rank saves its own)."""
        return {"defaults": dict(self.defaults), "step": self.step_count,
                "rank": self.group.rank, "size": self.group.size, "numel": self.numel,
                "exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy()}

    def param_slices(self):
        """(parameter, lo, hi, offset) for every trainable parameter overlapping this rank's chunks:
        the parameter's flattened elements [lo, hi) live at the moments' [offset, offset + hi - lo).
        This maps the flat moments back to parameters (a checkpoint stores them by name)."""
        for bucket, state in zip(self.buckets, self.state_slices):
            chunk = self.mine(bucket)
            for p, where in zip(bucket.params, bucket.slices):
                lo, hi = max(chunk.start, where.start), min(chunk.stop, where.stop)
                if lo < hi:
                    yield p, int(lo - where.start), int(hi - where.start), int(state.start + lo - chunk.start)

    def load_param_moments(self, moments, step):
        """Set the state from whole per-parameter moments: `moments` maps id(parameter) to
        (exp_avg, exp_avg_sq) shaped like the parameter; this rank keeps its chunk of them.
        A parameter missing from `moments` gets zero moments (as if it never had a gradient)."""
        self.exp_avg[:], self.exp_avg_sq[:] = 0, 0
        for p, lo, hi, offset in self.param_slices():
            if id(p) in moments:
                for own, whole in zip((self.exp_avg, self.exp_avg_sq), moments[id(p)]):
                    own[offset:offset + hi - lo] = np.reshape(whole, -1)[lo:hi]
        self.step_count = int(step)

    def load_state_dict(self, state_dict):
        here = {"rank": self.group.rank, "size": self.group.size, "numel": self.numel}
        saved = {k: state_dict[k] for k in here}
        if saved != here:
            raise ValueError(f"ZeroOptimizer.load_state_dict: the shard was saved at {saved}, "
                             f"this optimizer is at {here}")
        for name in ("exp_avg", "exp_avg_sq"):
            if np.shape(state_dict[name]) != (self.shard_size,):
                raise ValueError(f"ZeroOptimizer.load_state_dict: '{name}' has shape {np.shape(state_dict[name])}, "
                                 f"the shard has ({self.shard_size},)")
        self.defaults.update(state_dict["defaults"])
        self.step_count = int(state_dict["step"])
        self.exp_avg = np.array(state_dict["exp_avg"], dtype=self.exp_avg.dtype)
        self.exp_avg_sq = np.array(state_dict["exp_avg_sq"], dtype=self.exp_avg_sq.dtype)
