"""Rebuild a dense tensor from the pieces that ranks saved, and cut this rank's piece of it.

A name's pieces, saved under any layout, become the dense tensor in three moves:

    dp, cp every replica holds the same piece (cp replicates the parameters as dp does):
           read the lowest dp rank's. (ZeRO moments are the exception: each dp × cp rank
           saved a flat range [lo, hi) of the local array, so the ranges of all of them
           are laid end to end and reshaped to the local shape.)
    tp     concatenate the tp ranks' pieces along tp_axis, in tp order, and trim the
           padding (a vocabulary tp does not divide) to full_shape
    pp     a name lives on exactly one pipeline stage, so there is nothing to merge

Then the loading rank keeps its own block of the dense tensor, for its tp size and rank
(`tensor_parallel.sharding.shard`), or the whole tensor if it is replicated. The
loading layout never has to resemble the saving one.
"""
import numpy as np

from ..tensor_parallel.sharding import is_sharded, shard, trim
from .files import CheckpointError


def key(kind, name):
    """The array's name inside a shard file: 'param/blocks.0.ln_1.weight', 'exp_avg/...'."""
    return f"{kind}/{name}"


def local_array(pieces, kind, name, read):
    """One tp rank's local array of `name` (pieces of that tp rank only)."""
    if kind == "param" or pieces[0]["moments"] is None:
        first = min(pieces, key=lambda p: p["dp"])
        return read(first["file"], key(kind, name))
    ranges = sorted(pieces, key=lambda p: p["moments"][0])
    flat = np.concatenate([read(p["file"], key(kind, name)) for p in ranges])
    shape, bounds = ranges[0]["shape"], [p["moments"] for p in ranges]
    end_to_end = all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    if bounds[0][0] != 0 or not end_to_end or flat.size != int(np.prod(shape)):
        raise CheckpointError(f"the ZeRO ranges of {kind} '{name}' do not cover its {shape} elements")
    return flat.reshape(shape)


def dense(entry, kind, name, read):
    """The dense (single-device) array of `name`: `kind` is "param", "exp_avg" or "exp_avg_sq";
    read(file, key) returns a saved array."""
    pieces = [p for p in entry["pieces"] if kind == "param" or "moments" in p]
    by_tp = {}
    for piece in pieces:
        by_tp.setdefault(piece["tp"], []).append(piece)
    if entry["tp_axis"] is None:
        return local_array(by_tp[min(by_tp)], kind, name, read)
    tp_ranks = sorted(by_tp)
    if tp_ranks != list(range(len(tp_ranks))):
        raise CheckpointError(f"'{name}' is sharded over tp, but the checkpoint holds tp pieces {tp_ranks}")
    joined = np.concatenate([local_array(by_tp[t], kind, name, read) for t in tp_ranks], axis=entry["tp_axis"])
    return trim(joined, entry["full_shape"])


def local_piece(full, param, tp_group):
    """This rank's block of the dense `full` for `param` (the param's own tp layout)."""
    if not is_sharded(param):
        return full
    return shard(full, param.tp_axis, tp_group, param.shape[param.tp_axis] * tp_group.size)


def has_moments(entry):
    return any("moments" in piece for piece in entry["pieces"])
