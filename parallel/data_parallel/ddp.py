"""Data parallelism: every rank holds a full replica and trains on its own slice of the batch.

    rank r:  forward(batch_r) ─▶ backward ─▶ grads_r ─┐
                                                      ├─ all-reduce, ÷ n ─▶ same grads on every rank ─▶ optimizer
    rank s:  forward(batch_s) ─▶ backward ─▶ grads_s ─┘

The mean of the n per-rank mean losses is the mean loss of the global batch (equal
local batches), so averaging the gradients gives exactly the single-device gradient,
and identical gradients keep the replicas identical step after step.

How `DataParallel` does it, the way PyTorch's DDP does:

* Construction broadcasts every parameter from rank 0 (frozen ones too: the replicas
  must be the same model), so ranks seeded differently still start from rank 0's weights.
* Buckets. The trainable parameters, in REVERSE registration order (roughly the order
  backward produces their gradients), are cut into buckets of at most `bucket_mb` MiB
  (a larger parameter gets a bucket of its own). A bucket's gradients travel as one flat
  buffer: one all-reduce per bucket instead of one per parameter.
* Overlap. Each trainable parameter has a post-accumulate-grad hook, which fires once
  its `.grad` is final for this backward (a tied parameter used twice fires once, with
  the summed gradient). When every parameter of a bucket is ready, the bucket is packed
  and its all-reduce started with `async_op=True`, so it runs while backward computes
  the remaining gradients. Buckets start strictly in index order, so every rank issues
  the same collectives in the same order even if its graph differs. (MPICH moves a
  non-blocking collective forward inside later MPI calls; MPICH_ASYNC_PROGRESS=1 adds
  a progress thread that moves it while numpy computes.)
* The sync finishes by itself: the hook that makes the last parameter ready waits for
  every bucket and writes the averaged gradients back into `.grad`. So when
  `loss.backward()` returns, gradients are averaged; nothing to remember before
  `optimizer.step()`. `finish_grad_sync()` does the same explicitly (idempotent); it is
  only needed after backward passes whose forwards all ran inside `no_sync()` (e.g. a
  pipeline schedule that syncs once after its last micro-batch).
* Unused parameters (DDP's find_unused_parameters, always on): forward records the
  parameters that its output's graph does not reach, and the first hook of backward
  marks them ready (forward itself, when its output reaches none at all: no hook will
  fire); their contribution is their current `.grad` (accumulated under no_sync) or
  zeros. Every rank thus reduces every bucket in lockstep, and after the sync every
  trainable parameter has a gradient, possibly zeros. (A single device would leave a
  parameter no rank used at `.grad = None`, which AdamW skips; here it gets a zero
  gradient, so AdamW still decays it.)
* Frozen parameters (`requires_grad=False`) are in no bucket: never reduced, never changed.
* Mixed precision (`reduce_dtype`, as FSDP's MixedPrecision names it): a model computing in
  16 bits (minitensor.amp) has 16-bit gradients; with `reduce_dtype=np.float32` the buckets
  are float32, so the sum over n ranks neither rounds n − 1 times nor overflows float16
  under loss scaling, and the mean is rounded to 16 bits once, into `.grad` (then
  `amp.grads_to_master()`, exactly as on one device). An inf on any rank is inf in every
  rank's mean, so every rank's scaler skips alike without a flag of its own.
* `no_sync()`: as in DDP, FORWARD decides. A forward run inside the block records
  `require_sync = False`, and the hooks of its backward do nothing (wherever that
  backward runs), so gradients just accumulate locally; the backward of the first
  forward outside it reduces the ACCUMULATED gradients.
* Every rank communicates alike, whatever its local gradients: whether a sync is due
  depends only on the program order (forwards, no_sync blocks, syncs), which is the
  same on every rank, never on which parameters happened to get a gradient here.
"""
import contextlib

from minitensor.autograd import is_grad_enabled, topological_order
from minitensor.tensor import Tensor

from .reducer import Reducer


def broadcast_parameters(params, group, root=0):
    """Copy rank `root`'s value of every parameter into every rank's, in place."""
    for p in params:
        group.broadcast(p.data, root)


def output_tensors(output):
    """The Tensors inside a forward's output (a Tensor, or nested tuples/lists/dicts)."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in output_tensors(item)]
    return []


class DataParallel:
    """Wrap `module` so that gradients are averaged over `group` (see the module docstring).

    `forward`/`__call__` run the module; every other attribute (`parameters()`,
    `named_parameters()` with single-device names, `state_dict()`, `zero_grad()`, ...)
    is the module's own.
    """

    def __init__(self, module, group, bucket_mb=25, overlap=True, reduce_dtype=None):
        if not bucket_mb > 0:
            raise ValueError(f"DataParallel: bucket_mb={bucket_mb!r} must be positive")
        self.module, self.group, self.overlap, self.reduce_dtype = module, group, overlap, reduce_dtype
        broadcast_parameters(module.parameters(), group)
        self.names = {id(p): name for name, p in module.named_parameters()}
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.reducer = self.make_reducer(trainable, bucket_mb)
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        self.ready = [set() for _ in self.buckets]  # per bucket: ids of the parameters whose gradient is final
        self.sync_enabled = True  # False inside no_sync()
        self.require_sync = False  # the last forward ran outside no_sync(): its backward syncs
        self.synced = True  # averaged, and no forward or no_sync() block began since
        self.waiting_for = len(trainable)  # parameters not yet ready this step
        self.unused = []  # parameters the last forward's output does not reach, not yet marked ready
        self.unused_ids = set()  # all of them, to catch a gradient that reaches one anyway
        for p in trainable:
            p.register_post_accumulate_grad_hook(self.on_grad_ready)

    def make_reducer(self, trainable, bucket_mb):
        """Buckets of the trainable parameters in reverse order (ZeRO-2/3 reduce-scatter instead)."""
        return Reducer(trainable[::-1], self.group, bucket_mb, dtype=self.reduce_dtype)

    def __getattr__(self, name):  # only called for attributes DataParallel itself lacks
        if name == "module":
            raise AttributeError(name)
        return getattr(self.module, name)

    def register_comm_hook(self, hook):
        """Communicate each bucket with `hook` instead of an all-reduce (Reducer.register_comm_hook)."""
        self.reducer.register_comm_hook(hook)

    @property
    def buckets(self):
        """The reducer's buckets; bucket 0 (the last parameters registered) starts first."""
        return self.reducer.buckets

    def forward(self, *args, **kwargs):
        if self.waiting_for < len(self.bucket_of):
            raise RuntimeError(
                f"DataParallel: the previous backward made {len(self.bucket_of) - self.waiting_for} of "
                f"{len(self.bucket_of)} trainable parameters ready but never finished the gradient sync; "
                f"call finish_grad_sync() before the next forward")
        output = self.module(*args, **kwargs)
        if not is_grad_enabled():
            return output
        self.synced = False
        self.require_sync = self.sync_enabled
        self.unused = self.unreachable_parameters(output) if self.require_sync else []
        self.unused_ids = {id(p) for p in self.unused}
        if self.unused and len(self.unused) == len(self.bucket_of):
            self.mark_unused_ready()  # no hook will fire in this rank's backward; the others' wait for us
        return output

    __call__ = forward

    @contextlib.contextmanager
    def no_sync(self):
        """Forwards inside the block accumulate gradients locally; the backward of the first
        forward after it (or finish_grad_sync()) reduces the sum."""
        previous, self.sync_enabled = self.sync_enabled, False
        self.synced = False  # gradients accumulate from here (without a forward of ours, as a pipeline does)
        try:
            yield
        finally:
            self.sync_enabled = previous

    # --- the per-step state machine -----------------------------------------------

    def unreachable_parameters(self, output):
        """The trainable parameters that backward from forward's `output` cannot reach."""
        roots = [t for t in output_tensors(output) if t.requires_grad]
        reached = {id(t) for root in roots for t in topological_order(root)}
        return [p for b in self.buckets for p in b.params if id(p) not in reached]

    def on_grad_ready(self, p):
        """The hook: `p.grad` is final for this backward."""
        if not self.require_sync:
            return
        if id(p) in self.unused_ids:
            raise RuntimeError(
                f"DataParallel: parameter '{self.names[id(p)]}' got a gradient although the output of "
                f"forward() does not depend on it; compute the loss from the output of forward()")
        self.mark_unused_ready()  # the first hook of the step also readies the unused parameters
        self.mark_ready(p)

    def mark_unused_ready(self):
        unused, self.unused = self.unused, []
        for q in unused:
            self.mark_ready(q)

    def mark_ready(self, p):
        ready = self.ready[self.bucket_of[id(p)]]
        if id(p) in ready:
            raise RuntimeError(f"DataParallel: parameter '{self.names[id(p)]}' got two gradients in one step "
                               f"(two backward passes without finish_grad_sync() in between)")
        ready.add(id(p))
        self.waiting_for -= 1
        if self.overlap:
            self.start_ready_buckets()
        if self.waiting_for == 0:
            self.reduce_buckets()

    def start_ready_buckets(self):
        """Start the all-reduce of each next bucket, in index order, while it is ready."""
        # exercise 04.3: start ready buckets, in index order
        # hint: while the next bucket not yet started (self.reducer.started) is ready (is_ready), start it:
        # hint: never skip ahead, so every rank issues the same collectives in the same order.
        while self.reducer.started < len(self.buckets) and self.is_ready(self.reducer.started):
            self.reducer.start_next()
        # end exercise

    def is_ready(self, bucket):
        """Every parameter of bucket number `bucket` has its final gradient."""
        return len(self.ready[bucket]) == len(self.buckets[bucket].params)

    def finish_grad_sync(self):
        """Average every gradient accumulated since the last sync over the group.

        Needed after backward passes whose forwards all ran inside `no_sync()` (the
        backward of a forward outside it syncs by itself). A no-op when nothing began
        since the last sync (no forward, no no_sync() block): program order, which
        every rank sees alike, so a rank whose backward produced no gradient still
        takes part (its gradients count as zeros). Every rank must call it alike.
        Also forgets the last forward's record (`require_sync`, unused parameters).
        """
        if not self.synced:
            self.reduce_buckets()
        self.require_sync, self.unused, self.unused_ids = False, [], set()

    def reduce_buckets(self):
        """Finish every bucket's all-reduce (starting those not yet started) and start a new step.

        The forward's record stays: a gradient that reaches an unused parameter later
        in the same backward is still caught."""
        self.reducer.finish()
        for ready in self.ready:
            ready.clear()
        self.waiting_for, self.synced = len(self.bucket_of), True
