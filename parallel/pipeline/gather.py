"""Merge named arrays held by different ranks into one dict on every rank.

Each pipeline rank holds a disjoint part of the model (`blocks.2.*` on one rank,
`blocks.0.*` on another); `gather_named_arrays` gives every rank the union, so a
pipeline's parameters and gradients compare name by name with the single-device
model. Only buffer collectives are used: the names, dtypes and shapes travel as an
int64 "header" (a name as its UTF-8 bytes), then the values as one flat buffer per
dtype. Variable lengths are handled by gathering the lengths first and padding.
"""
import json

import numpy as np

from ..comm.group import SUPPORTED_DTYPES
from .schedules import KINDS
from .timeline import Event


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
    """Every rank's JSON-able `value`, as a list in rank order (its UTF-8 bytes travel as numbers)."""
    raw = np.frombuffer(json.dumps(value).encode(), dtype=np.uint8).astype(np.int32)
    return [json.loads(row.astype(np.uint8).tobytes()) for row in all_gather_ragged(group, raw)]


def all_gather_events(group, events, rank=None):
    """Every rank's timeline events, on every rank; each labelled with `rank` when given
    (e.g. the world rank), else with its own `Event.rank`. Six numbers travel per event."""
    rows = np.array([[e.rank if rank is None else rank, KINDS.index(e.kind), e.microbatch, e.chunk, e.start, e.end]
                     for e in events], dtype=np.float64).reshape(-1)
    return [Event(int(r), KINDS[int(k)], int(mb), int(c), start, end)
            for flat in all_gather_ragged(group, rows) for r, k, mb, c, start, end in flat.reshape(-1, 6)]


def _encode_header(named):
    """[len(name), *name bytes, dtype code, ndim, *shape] for every entry, as int64."""
    codes = []
    for name, array in named.items():
        raw = list(name.encode())
        codes += [len(raw), *raw, SUPPORTED_DTYPES.index(array.dtype), array.ndim, *array.shape]
    return np.array(codes, dtype=np.int64)


def _decode_header(codes):
    """Inverse of _encode_header: [(name, dtype, shape)]."""
    entries, i, codes = [], 0, codes.tolist()
    while i < len(codes):
        n = codes[i]
        name = bytes(codes[i + 1:i + 1 + n]).decode()
        dtype, ndim = SUPPORTED_DTYPES[codes[i + 1 + n]], codes[i + 2 + n]
        shape = tuple(codes[i + 3 + n:i + 3 + n + ndim])
        entries.append((name, dtype, shape))
        i += 3 + n + ndim
    return entries


def gather_named_arrays(group, named):
    """{name: array} of every rank of `group`, merged (in rank order) on every rank.

    Collective: every rank of the group must call it. Names must be disjoint across
    ranks (a ValueError names a duplicate and its ranks)."""
    named = {name: np.ascontiguousarray(a) for name, a in named.items()}
    entries = [_decode_header(h) for h in all_gather_ragged(group, _encode_header(named))]
    owner = {}
    for rank, rank_entries in enumerate(entries):
        for name, _, _ in rank_entries:
            if name in owner:
                raise ValueError(f"gather_named_arrays: '{name}' is held by ranks {owner[name]} and {rank}; "
                                 f"the parts to merge must be disjoint")
            owner[name] = rank
    merged = {}
    for dtype in SUPPORTED_DTYPES:
        local = [a.reshape(-1) for a in named.values() if a.dtype == dtype]
        if not any(d == dtype for rank_entries in entries for _, d, _ in rank_entries):
            continue
        flats = all_gather_ragged(group, np.concatenate(local) if local else np.zeros(0, dtype))
        for rank_entries, flat in zip(entries, flats):
            offset = 0
            for name, d, shape in rank_entries:
                if d == dtype:
                    size = int(np.prod(shape))
                    merged[name] = flat[offset:offset + size].reshape(shape).copy()
                    offset += size
    return {name: merged[name] for rank_entries in entries for name, _, _ in rank_entries}
