"""The gradient reducer: gradients summed over a group through flat buckets.

    pack     copy each parameter's .grad into one flat buffer per bucket (no grad: zeros)
    start    begin the bucket's all-reduce, non-blocking
    wait     finish it
    unpack   write buffer / divisor back into each .grad, and drop the buffer

A bucket's flat buffer is made for its round and dropped after it: between steps a rank
holds its gradients once (in .grad), not a second time in flat copies.

One collective per bucket instead of one per parameter, and a bucket can travel
while backward is still computing the gradients of the next ones. What "start" does is
the reducer's communication hook (`register_comm_hook`, as in PyTorch's DDP): by default
`allreduce_hook`; `parallel.data_parallel.comm_hooks` has compressing ones (PowerSGD, top-k, sign). Every user of
gradient communication goes through here: `DataParallel` (which starts buckets from
its gradient hooks), `HybridGPT` (one reduction over dp after the pipeline schedule),
the tensor-parallel partial-gradient sum (`tensor_parallel.sharding`), and
`ZeroOptimizer` (which reduce-scatters one padded bucket instead of all-reducing).
`ShardedReducer` is the reduce-scatter path of ZeRO-2/3 (`fully_sharded.py`): each
rank keeps only its chunk of every averaged bucket, and the full gradients are freed.
"""
import time

import numpy as np

MIB = 2**20


def assign_buckets(params, bucket_bytes):
    """Cut `params` (in the order they should start) into lists of at most `bucket_bytes`
    bytes each. A larger parameter gets a bucket of its own; a new bucket also starts when
    the dtype changes: one flat buffer holds one dtype."""
    buckets, current, size = [], [], 0
    for p in params:
        if current and (size + p.data.nbytes > bucket_bytes or p.dtype != current[0].dtype):
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.data.nbytes
    return buckets + [current] if current else buckets


class Bucket:
    """Parameters laid end to end in one flat buffer of `length` elements (default: just
    enough; a longer buffer is zero-padded at the end, as ZeRO needs for equal chunks) of
    `dtype` (default: the parameters'; a 16-bit model's gradients are reduced in float32).

    The buffer is a transient copy: the reducers and ZeRO-1 drop it (`buffer = None`) once
    their collective is done and `allocate()` a fresh one for the next, so between steps
    no rank holds a flat copy of its gradients (DeepSpeed frees its flat gradient buffers
    alike). A Bucket made by hand starts with one."""

    def __init__(self, params, length=None, dtype=None):
        self.params = list(params)
        ends = np.cumsum([p.size for p in self.params])
        self.slices = [slice(end - p.size, end) for p, end in zip(self.params, ends)]
        self.numel = int(ends[-1])
        self.length, self.dtype = self.numel if length is None else length, np.dtype(dtype or self.params[0].dtype)
        self.allocate()

    def allocate(self):
        """A fresh flat buffer of zeros (the padding stays zero)."""
        self.buffer = np.zeros(self.length, self.dtype)
        return self.buffer

    @property
    def nbytes(self):
        """Bytes of the flat buffer while it exists."""
        return self.length * self.dtype.itemsize

    def pack(self):
        """The gradients in the flat buffer (a parameter without a gradient counts as zeros)."""
        # exercise 04.1: pack and unpack a bucket
        # hint: copy each p.grad, flattened, into self.buffer[where] (self.slices); no gradient counts as zeros.
        for p, where in zip(self.params, self.slices):
            self.buffer[where] = 0 if p.grad is None else p.grad.reshape(-1)
        return self.buffer
        # end exercise

    def unpack(self, divisor=1):
        """Write buffer / divisor back into each `.grad` (in place when there is one)."""
        # exercise 04.1: pack and unpack a bucket
        # hint: write buffer[where] / divisor back into each p.grad, in place when p.grad exists (np.divide's out=).
        for p, where in zip(self.params, self.slices):
            p.grad = np.divide(self.buffer[where].reshape(p.shape), divisor, out=p.grad).astype(p.dtype, copy=False)
        # end exercise

    def pack_values(self):
        """The parameters' values in the flat buffer (overwrites the packed gradients)."""
        for p, where in zip(self.params, self.slices):
            self.buffer[where] = p.data.reshape(-1)
        return self.buffer

    def unpack_values(self, flat):
        """Copy consecutive pieces of `flat` into the parameters' values, in place."""
        for p, where in zip(self.params, self.slices):
            p.data[...] = flat[where].reshape(p.shape)


def allreduce_hook(group, index, bucket):
    """The default communication hook: the sum of the packed bucket over `group`, non-blocking.

    A hook is called as hook(group, index, bucket) with the bucket's gradients packed in
    `bucket.buffer` (index: the bucket's number, 0 starts each round) and returns a request
    whose wait() leaves in `bucket.buffer` the sum over the group (or what stands for it)."""
    return group.all_reduce(bucket.buffer, async_op=True)


class Reducer:
    """Sum the gradients of `params` over `group`, bucket by bucket, and divide by `divisor`
    (group.size: the mean, as data parallelism needs; 1: the plain sum), in `dtype` (default
    the parameters'; a 16-bit model's gradients summed in float32, the mean rounded once).

    Buckets start in index order (`start_next`), so every rank issues the same collectives
    in the same order; `finish()` starts the rest, waits for all and unpacks."""

    def __init__(self, params, group, bucket_mb=25, divisor=None, dtype=None):
        self.group = group
        self.divisor = group.size if divisor is None else divisor
        self.buckets = [Bucket(ps, dtype=dtype) for ps in assign_buckets(params, bucket_mb * MIB)]
        for bucket in self.buckets:
            bucket.buffer = None  # made by start_next, dropped by finish: only while the bucket is in flight
        self.requests = []  # the all-reduces of buckets [0, len(requests)), in flight
        self.comm_hook = allreduce_hook
        self.spans = []  # the last round's [bucket index, start, end] in time.perf_counter seconds

    def register_comm_hook(self, hook):
        """Communicate each bucket with `hook(group, index, bucket)` (see allreduce_hook)."""
        self.comm_hook = hook

    @property
    def started(self):
        """How many buckets have their all-reduce started this round."""
        return len(self.requests)

    def note_start(self):
        """Open the next bucket's span (a new round's first clears the last round's)."""
        if self.started == 0:
            self.spans = []
        self.spans.append([self.started, time.perf_counter(), None])

    def start_next(self):
        index = self.started
        self.note_start()
        bucket = self.buckets[index]
        bucket.allocate()
        bucket.pack()
        self.requests.append(self.comm_hook(self.group, index, bucket))

    def finish(self):
        """Start every bucket not yet started, wait for all, write the results into .grad."""
        # exercise 04.2: finish the reduction and average
        # hint: start every bucket not yet started (start_next), then wait for each request in order
        # hint: and unpack its bucket divided by self.divisor; forget the requests for the next round.
        while self.started < len(self.buckets):
            self.start_next()
        for bucket, request, span in zip(self.buckets, self.requests, self.spans):
            request.wait()
            span[2] = time.perf_counter()  # when the reducer had the result: drawn in the timeline
            bucket.unpack(self.divisor)
        self.requests = []
        # end exercise
        for bucket in self.buckets:
            bucket.buffer = None  # the means are in .grad: no flat copy of the gradients between steps


def padded_length(numel, n):
    """The smallest multiple of n that holds numel elements: n equal chunks."""
    return -(-numel // n) * n


def values_chunk(bucket, rank, values=None):
    """A copy of chunk `rank` (of bucket.shard_size elements) of the bucket's parameter
    values laid end to end, zero-padded: what that rank keeps of them under ZeRO-2/3.
    `values`: other arrays of the parameters' shapes to cut instead (float32 masters)."""
    values = [p.data for p in bucket.params] if values is None else values
    flat = np.zeros(max(bucket.numel, (rank + 1) * bucket.shard_size), values[0].dtype)  # room for the padding
    for value, where in zip(values, bucket.slices):
        flat[where] = value.reshape(-1)
    return flat[rank * bucket.shard_size:(rank + 1) * bucket.shard_size].copy()


def keep_chunk(bucket, rank):
    """The values the parameters now hold (a loader's, a gather's writeback) become this rank's
    `param_shard`, and its rounding the `compute_shard` the forward gathers."""
    bucket.param_shard[:] = values_chunk(bucket, rank)
    refresh_compute_shard(bucket)


def refresh_compute_shard(bucket):
    """Round `param_shard` into `compute_shard` where they are two arrays (ZeRO-3 under a
    16-bit policy; otherwise one array, or no compute chunk at all)."""
    if bucket.compute_shard is not None and bucket.compute_shard is not bucket.param_shard:
        bucket.compute_shard[...] = bucket.param_shard


class ShardedReducer(Reducer):
    """The reduce-scatter path (ZeRO-2/3): the same buckets, each zero-padded to n equal
    chunks; `start_next` reduce-scatters a bucket instead of all-reducing it, and `finish`
    ADDS this rank's chunk / divisor to `bucket.grad_shard` (accumulating over rounds until
    `zero_grad_shards`) and frees every `.grad` of the bucket: the full gradients are gone.

    `param_lists`: the buckets' parameters (stage 3: one list per sharding unit); default:
    `assign_buckets(params, bucket_mb)` as the plain Reducer cuts them. `dtype`: what the
    gradients are reduced and kept in (default the parameters'; float32 for a 16-bit model:
    the kept chunk is then the float32 masters' gradient).

    Each bucket carries its `group` and `divisor` (ZeroOptimizer and the gathers of
    flat_units.py cut it over that group), and the parameter chunks ZeRO keeps: `param_shard`,
    the chunk the optimizer steps (the float32 masters under a mixed policy; stage 2 with
    one dtype keeps none: the full parameters are the truth), and under stage 3
    `compute_shard`, the chunk the forward gathers (the same array, or its 16-bit copy)."""

    def __init__(self, params, group, bucket_mb=25, divisor=None, param_lists=None, dtype=None):
        super().__init__(params, group, bucket_mb, divisor)
        lists = param_lists if param_lists is not None else [b.params for b in self.buckets]
        self.buckets = [Bucket(ps, length=padded_length(sum(p.size for p in ps), group.size), dtype=dtype)
                        for ps in lists]
        for bucket in self.buckets:
            bucket.group, bucket.divisor, bucket.shard_size = group, self.divisor, bucket.length // group.size
            bucket.grad_shard = np.zeros(bucket.shard_size, bucket.buffer.dtype)
            bucket.param_shard = bucket.compute_shard = None
            bucket.buffer = None  # a flat buffer exists only while its reduce-scatter is in flight

    def start_next(self):
        self.note_start()
        # exercise 14.1: the stage-2 reduce-scatter of a bucket
        # hint: give the bucket a fresh zero buffer of n·shard_size elements, pack it, start its reduce-scatter
        # hint: (async_op=True), then free every parameter's .grad: only the packed copy is left.
        bucket = self.buckets[self.started]
        bucket.buffer = np.zeros(bucket.shard_size * self.group.size, bucket.grad_shard.dtype)
        self.requests.append(self.group.reduce_scatter(bucket.pack(), async_op=True))
        for p in bucket.params:
            p.grad = None
        # end exercise

    def finish(self):
        """Start every bucket not yet started, wait for all, add the chunks to the grad shards,
        and drop the flat buffers."""
        while self.started < len(self.buckets):
            self.start_next()
        for bucket, request, span in zip(self.buckets, self.requests, self.spans):
            bucket.grad_shard += request.wait() / self.divisor
            span[2] = time.perf_counter()
            bucket.buffer = None
        self.requests = []

    def in_flight_bytes(self):
        """Bytes of the flat buffers whose reduce-scatter is in flight (the transient gradients)."""
        return sum(b.buffer.nbytes for b in self.buckets if b.buffer is not None)

    def zero_grad_shards(self):
        for bucket in self.buckets:
            bucket.grad_shard[:] = 0
