"""ZeRO stage 1 (Rajbhandari et al., 2020): AdamW whose moments are sharded across the dp group.

Plain data parallelism keeps the two AdamW moments of EVERY parameter on every rank:
n identical copies. ZeRO-1 lays all trainable parameters end to end as one flat vector
(zero-padded to a multiple of n) and gives rank r the r-th of n equal chunks; each rank
keeps moments only for its chunk, 1/n of the optimizer state. One step:

    flat local grads ──reduce-scatter──▶ my chunk of Σ grads, ÷ n   (the averaged gradient)
    my chunk of params ──adamw_update (my chunk of the moments)──▶ updated chunk
    updated chunks ──all-gather──▶ every rank's full, identical parameters

A reduce-scatter plus an all-gather move exactly what one all-reduce moves, so ZeRO-1
costs no extra communication. The arithmetic on each element is minitensor's own
`adamw_update`, so the result equals AdamW on the averaged gradients.

Composition: `ZeroOptimizer` owns ALL the data-parallel communication of its
parameters: it broadcasts them from rank 0 at construction and reduces the raw local
gradients itself in `step()`. Use it on the plain model, NOT wrapped in DataParallel
(which would all-reduce the gradients first: still correct, twice the traffic).
Gradient accumulation needs no `no_sync()`: backward never communicates, so run several
backward passes and step once. As in DataParallel, frozen parameters are not in the
flat vector (never communicated, never changed), and a trainable parameter without a
gradient contributes zeros, so every rank stays in lockstep.
"""
import numpy as np

from minitensor.optim import Optimizer, adamw_update

from .data_parallel import broadcast_parameters
from .reducer import Bucket


class ZeroOptimizer(Optimizer):
    """AdamW with ZeRO-1 sharded moments over `group` (same arguments as minitensor's AdamW)."""

    def __init__(self, params, group, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.group = group
        broadcast_parameters(self.params, group)
        self.flat_params = [p for p in self.params if p.requires_grad]
        dtypes = sorted({str(p.dtype) for p in self.flat_params})
        if len(dtypes) != 1:
            raise ValueError(f"ZeroOptimizer needs trainable parameters of one dtype, got {dtypes}")
        self.numel = sum(p.size for p in self.flat_params)
        self.shard_size = -(-self.numel // group.size)  # ceil: the last chunk carries the padding
        self.start = group.rank * self.shard_size
        self.bucket = Bucket(self.flat_params, length=self.shard_size * group.size)  # n equal chunks
        dtype = self.flat_params[0].dtype
        self.step_count = 0
        self.exp_avg = np.zeros(self.shard_size, dtype)
        self.exp_avg_sq = np.zeros(self.shard_size, dtype)
        self.grad_shard = None  # the averaged gradient of this rank's chunk, after step()

    @property
    def shard(self):
        """This rank's chunk [start, stop) of the flat trainable parameters (padding excluded)."""
        return self.start, min(self.start + self.shard_size, self.numel)

    def step(self):
        # exercise 04.4: the ZeRO-1 step
        # hint: reduce-scatter the packed gradients and divide by the group size; update this rank's chunk
        # hint: of the packed values with adamw_update and its moment shards; all-gather the chunks back.
        mine = slice(self.start, self.start + self.shard_size)
        self.grad_shard = self.group.reduce_scatter(self.bucket.pack()) / self.group.size
        param_shard = self.bucket.pack_values()[mine].copy()
        self.step_count += 1
        d = self.defaults
        adamw_update(param_shard, self.grad_shard, self.exp_avg, self.exp_avg_sq, self.step_count, d["lr"],
                     *d["betas"], d["eps"], d["weight_decay"])
        self.bucket.unpack_values(self.group.all_gather(param_shard))
        # end exercise

    def state_bytes(self):
        """Bytes of optimizer state on THIS rank: ≈ AdamW.state_bytes() / group size."""
        return self.exp_avg.nbytes + self.exp_avg_sq.nbytes

    def state_dict(self):
        """This rank's shard of the state (each rank saves its own)."""
        return {"defaults": dict(self.defaults), "step": self.step_count,
                "rank": self.group.rank, "size": self.group.size, "numel": self.numel,
                "exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy()}

    def param_slices(self):
        """(parameter, lo, hi, offset) for every trainable parameter overlapping this rank's chunk:
        the parameter's flattened elements [lo, hi) live at shard[offset:offset + hi - lo].
        This maps the flat moments back to parameters (a checkpoint stores them by name)."""
        begin, end = self.shard
        position = 0
        for p in self.flat_params:
            lo, hi = max(begin, position), min(end, position + p.size)
            if lo < hi:
                yield p, lo - position, hi - position, lo - begin
            position += p.size

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
