"""Sharding units as flat chunks (ZeRO-2/3): where each rank's piece of a unit lives.

A unit's trainable parameters lie end to end in one flat bucket (the reducer's `Bucket`),
cut into n equal chunks; rank r keeps chunk r. Between uses a parameter's `.data` is a
freed placeholder (one shared NaN, no memory); `attach` points it into a gathered flat copy.
Under a mixed precision policy the kept chunk is the float32 masters' (`shard_masters`),
beside a 16-bit `compute_shard` that the forward gathers. `held_bytes` counts what the
arrays really hold, each owning buffer once; `gather_grad_shards` rebuilds whole averaged
gradients from every rank's chunk (for checks and checkpoints, not the training step).

Mixed precision (HybridGPT with a 16-bit policy, minitensor.amp): the chunks ARE the
float32 master weights (`shard_masters`: no rank keeps a whole master), beside the
float32 moments; gradients are reduce-scattered in float32 into a float32 `grad_shard`
(the master's gradient); stage 3 gathers a 16-bit copy of each chunk (`compute_shard`,
refreshed by each step), stage 2 all-gathers the rounded chunks into the 16-bit
parameters. `full_parameters()` (and `masters_gathered` for stage 2) gather the masters.
"""
import contextlib

import numpy as np

from .reducer import keep_chunk, values_chunk

_FREED = {}


def freed_placeholder(shape, dtype):
    """A stand-in of the parameter's shape and (compute) dtype holding no memory (one shared
    NaN): any read of a freed parameter outside its unit turns the result into NaN."""
    scalar = _FREED.setdefault(np.dtype(dtype), np.array(np.nan, dtype))
    return np.broadcast_to(scalar, shape)


def owner(array):
    """The array that owns the memory `array` views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def attach(bucket, full):
    """Point every parameter's .data at its piece of the gathered flat `full`."""
    for p, where in zip(bucket.params, bucket.slices):
        p.data = full[where].reshape(p.shape)


def compute_copy(shard, params):
    """The chunk the forward gathers: `shard` itself, or its rounding to the parameters'
    (16-bit compute) dtype when the shard holds float32 masters."""
    dtype = params[0].dtype
    return shard if shard.dtype == dtype else shard.astype(dtype)


class FlatUnit:
    """One sharding unit: its trainable parameters end to end in `bucket` (n equal chunks,
    the reducer's bucket for the same parameters), of which this rank keeps `param_shard`
    (the masters' chunk, if the caller cut one: `shard_masters`) and `compute_shard`, the
    chunk its forward gathers (16-bit under a mixed policy, else `param_shard` itself)."""

    def __init__(self, name, bucket, group):
        self.name, self.bucket, self.group = name, bucket, group
        self.params = bucket.params
        if bucket.param_shard is None:
            bucket.param_shard = values_chunk(bucket, group.rank)
        bucket.compute_shard = compute_copy(bucket.param_shard, self.params)
        self.free()

    def start_gather(self):
        return self.group.all_gather(self.bucket.compute_shard, async_op=True)

    def attach(self, full):
        attach(self.bucket, full)

    def free(self):
        for p in self.params:  # in the dtype the forward computes in (a gather of the masters may have left float32)
            p.data = freed_placeholder(p.shape, self.bucket.compute_shard.dtype)

    @property
    def full_bytes(self):
        return self.bucket.shard_size * self.group.size * self.bucket.compute_shard.itemsize

    def __repr__(self):
        return f"FlatUnit({self.name}, {len(self.params)} params, {self.bucket.numel} elements)"


def shard_masters(buckets, masters):
    """ZeRO-2/3 under a mixed precision policy: cut each bucket's chunk (over its group) of the
    float32 `masters` (by id of the bucket's compute parameters) into `bucket.param_shard`; the
    whole masters can then go. Each rank keeps 1/n of the masters, as of the moments."""
    for bucket in buckets:
        bucket.param_shard = values_chunk(bucket, bucket.group.rank, [masters[id(p)].data for p in bucket.params])


@contextlib.contextmanager
def masters_gathered(buckets, writeback=False):
    """ZeRO-2 under a mixed policy: inside the block every parameter's .data is its whole
    float32 master, all-gathered from the shards; with writeback, the values the block
    leaves become the shards, and their rounding the 16-bit parameters."""
    compute = [[p.data for p in bucket.params] for bucket in buckets]
    for bucket in buckets:
        attach(bucket, bucket.group.all_gather(bucket.param_shard))
    try:
        yield
    finally:
        for bucket, arrays in zip(buckets, compute):
            if writeback:
                keep_chunk(bucket, bucket.group.rank)
            for p, array in zip(bucket.params, arrays):
                if writeback:
                    array[...] = p.data
                p.data = array


def held_bytes(arrays):
    """Bytes of memory the arrays hold: each owning buffer once, a freed placeholder none."""
    owners = {id(o): o for o in map(owner, arrays)}
    return sum(o.nbytes for o in owners.values() if o is not _FREED.get(o.dtype))


def gather_grad_shards(buckets):
    """{id(parameter): its full averaged gradient} from every rank's grad shards (collective
    over each bucket's group)."""
    grads = {}
    for bucket in buckets:
        flat = bucket.group.all_gather(bucket.grad_shard)
        grads.update({id(p): flat[where].reshape(p.shape) for p, where in zip(bucket.params, bucket.slices)})
    return grads
