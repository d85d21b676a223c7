"""Gathers of data whose size differs from rank to rank, on buffer collectives only.

    all_gather_ragged   1-D arrays of different lengths (gather the lengths, then pad)
    all_gather_json     any JSON-able value (its UTF-8 bytes travel as numbers)
    gather_named_arrays {name: array} dicts merged into one (e.g. each pipeline rank's
                        parameters, so they compare name by name with one device)

Names, dtypes and shapes travel as an int64 "header"; `describe` / `read_description`
write and read the [dtype code, ndim, *shape] part of it, which the MPI backend's
point-to-point header uses too.
"""
import json

import numpy as np

from .checks import SUPPORTED_DTYPES, dtype_code, named_dtype


def describe(dtype, shape):
    """[dtype code, ndim, *shape]: what a receiver needs to know of an array."""
    return [dtype_code(dtype), len(shape), *shape]


def read_description(codes, i=0):
    """(dtype, shape, index after it) of the description written by `describe` at codes[i]."""
    dtype, ndim = named_dtype(SUPPORTED_DTYPES[int(codes[i])]), int(codes[i + 1])
    shape = tuple(int(n) for n in codes[i + 2:i + 2 + ndim])
    return dtype, shape, i + 2 + ndim


def all_gather_ragged(group, flat):
    """Every rank's 1-D array `flat` (lengths may differ), as a list in rank order."""
    lengths = group.all_gather(np.array([flat.size], dtype=np.int64))
    width = int(lengths.max())
    if width == 0:
        return [flat[:0].copy() for _ in range(group.size)]
    padded = np.zeros((1, width), flat.dtype)
    padded[0, :flat.size] = flat
    rows = group.all_gather(padded)
    return [rows[r, :n] for r, n in enumerate(lengths)]


def all_gather_json(group, value):
    """Every rank's JSON-able `value`, as a list in rank order."""
    raw = np.frombuffer(json.dumps(value).encode(), dtype=np.uint8).astype(np.int32)
    return [json.loads(row.astype(np.uint8).tobytes()) for row in all_gather_ragged(group, raw)]


def encode_header(named):
    """[len(name), *name bytes, *describe(array)] for every entry, as int64."""
    codes = []
    for name, array in named.items():
        raw = list(name.encode())
        codes += [len(raw), *raw, *describe(array.dtype, array.shape)]
    return np.array(codes, dtype=np.int64)


def decode_header(codes):
    """Inverse of encode_header: [(name, dtype, shape)]."""
    entries, i, codes = [], 0, codes.tolist()
    while i < len(codes):
        n = codes[i]
        name = bytes(codes[i + 1:i + 1 + n]).decode()
        dtype, shape, i = read_description(codes, i + 1 + n)
        entries.append((name, dtype, shape))
    return entries


def gather_named_arrays(group, named):
    """{name: array} of every rank of `group`, merged (in rank order) on every rank.

    Collective: every rank of the group must call it. Names must be disjoint across
    ranks (a ValueError names a duplicate and its ranks). The values travel as one flat
    buffer per dtype."""
    named = {name: np.ascontiguousarray(a) for name, a in named.items()}
    entries = [decode_header(h) for h in all_gather_ragged(group, encode_header(named))]
    owner = {}
    for rank, rank_entries in enumerate(entries):
        for name, _, _ in rank_entries:
            if name in owner:
                raise ValueError(f"gather_named_arrays: '{name}' is held by ranks {owner[name]} and {rank}; "
                                 f"the parts to merge must be disjoint")
            owner[name] = rank
    merged = {}
    for dtype_name in SUPPORTED_DTYPES:
        if not any(d.name == dtype_name for rank_entries in entries for _, d, _ in rank_entries):
            continue
        dtype = named_dtype(dtype_name)
        local = [a.reshape(-1) for a in named.values() if a.dtype == dtype]
        flats = all_gather_ragged(group, np.concatenate(local) if local else np.zeros(0, dtype))
        for rank_entries, flat in zip(entries, flats):
            offset = 0
            for name, d, shape in rank_entries:
                if d == dtype:
                    size = int(np.prod(shape))
                    merged[name] = flat[offset:offset + size].reshape(shape).copy()
                    offset += size
    return {name: merged[name] for rank_entries in entries for name, _, _ in rank_entries}
