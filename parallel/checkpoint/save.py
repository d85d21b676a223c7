"""`save_checkpoint`: every rank writes its shard, rank 0 the manifest, then one rename publishes it.

    rank r:  arrays by single-device name ─▶ DIR/step_000123.tmp/rank_0000r.npz (fsync'ed)
             record {file, coords, bytes, sha256, per-name piece} ─┐
                                                                   ├─ all-gather records
    rank 0:  manifest.json from every record ◀─────────────────────┘
             rename step_000123.tmp ─▶ step_000123, then latest ─▶ step_000123, prune to keep
    all:     barrier (nobody returns before the checkpoint is published)

Each file holds `param/<name>` (the rank's local array), `exp_avg/<name>` and
`exp_avg_sq/<name>` (whole local arrays under AdamW; the rank's flat range under ZeRO)
and `rng` (its random generators as JSON). dp replicas write identical parameters
(every file describes its whole rank); the loader reads dp rank 0's.
"""
import json
from pathlib import Path

import numpy as np

from ..comm.gather import all_gather_json
from .files import MANIFEST, CheckpointError, begin_save, commit_save, shard_name, step_name, write_durably
from .manifest import build_manifest, rank_record
from .reshard import key
from .state import MOMENTS, moments_by_name, named_parameters, optimizer_type, rng_state_json


def write_shard(path, params, moments, rng_json):
    """This rank's arrays, by single-device name, as one .npz (flushed to disk)."""
    arrays = {key("param", name): p.data for name, p in params.items()}
    for name, m in moments.items():
        arrays.update({key(kind, name): m[kind] for kind in MOMENTS})
    arrays["rng"] = np.array(rng_json)
    write_durably(path, lambda f: np.savez(f, **arrays))


def save_checkpoint(directory, model, *, step, extra=None, keep=2):
    """Save the `ParallelModel` `model` (its parameters, its optimizer's state, its random
    streams) after `step` as DIR/step_XXXXXX (collective: every rank calls it).

    The manifest keeps model.config (checked on resume), model.layout() and `extra`
    (a JSON-able dict: the data sampler's state, ...). The newest `keep` complete
    checkpoints are kept. Returns the step directory's Path.
    """
    mesh, optimizer = model.mesh, model.optimizer
    world, root = mesh.world, Path(directory)
    final = root / step_name(step)
    if final.exists():  # checked on every rank, so every rank raises
        raise CheckpointError(f"checkpoint {final} already exists; save step {step} elsewhere or remove it")
    if world.rank == 0:
        begin_save(root, step)
    world.barrier()
    tmp = root / (step_name(step) + ".tmp")
    params = named_parameters(model)
    moments = moments_by_name(optimizer, params)
    path = tmp / shard_name(world.rank)
    write_shard(path, params, moments, rng_state_json(model))
    records = all_gather_json(world, rank_record(path, world.rank, mesh.coords._asdict(), params, moments))
    if world.rank == 0:
        optim = {"type": optimizer_type(optimizer),
                 "defaults": dict(optimizer.defaults) if optimizer is not None else None}
        manifest = build_manifest(records, step, model.config, model.layout(), mesh.sizes(), optim, extra or {})
        write_durably(tmp / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        commit_save(tmp, keep)
    world.barrier()
    return final
