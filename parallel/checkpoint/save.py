"""`save_checkpoint`: every rank writes its shard, rank 0 the manifest, then one rename publishes it.

    rank r:  arrays by single-device name ─▶ DIR/step_000123.tmp/rank_0000r.npz (fsync'ed)
             record {file, coords, bytes, sha256, per-name piece} ─┐
                                                                   ├─ all-gather records
    rank 0:  manifest.json from every record ◀─────────────────────┘
             rename step_000123.tmp ─▶ step_000123, then latest ─▶ step_000123, prune to keep
    all:     all-gather rank 0's outcome (nobody returns before the checkpoint is published)

A step that fails with an OSError on any rank (disk full, ...) fails on every rank alike:
each rank's outcome is in the all-gather that follows the step, so every rank raises the
same CheckpointError, rank 0 removes step_000123.tmp, and `latest` stays where it was.

Each file holds `param/<name>` (the rank's local array), `exp_avg/<name>` and
`exp_avg_sq/<name>` (whole local arrays under AdamW; the rank's flat range under ZeRO; in
the moments' dtype, the manifest's optimizer.moment_dtype: bfloat16 as its uint16 bits)
and `rng` (its random generators as JSON), `comm_hook/<key>` (the dp communication
hook's error feedback and PowerSGD's Q, parallel.data_parallel.comm_hooks: per rank and bucket) and
`outer/<key>` (local SGD's outer optimizer, parallel.data_parallel.local_sgd). dp replicas write identical
parameters (every file describes its whole rank); the loader reads dp rank 0's. Under local
SGD they differ between outer steps: every replica writes its own parameters and AdamW
moments, the manifest's optimizer.outer says so, and each replica loads its own back.
"""
from pathlib import Path

import numpy as np

from ..comm.gather import all_gather_json
from .files import (
    CheckpointError,
    abandon_save,
    begin_save,
    commit_save,
    last_good,
    shard_name,
    step_name,
    write_durably,
)
from .manifest import build_manifest, rank_record, write_manifest
from .reshard import key
from .state import (
    MOMENTS,
    file_bits,
    moment_dtype,
    moments_by_name,
    named_parameters,
    optimizer_type,
    rank_states,
    rng_state_json,
)


def write_shard(path, params, moments, rng_json, states):
    """This rank's arrays, by single-device name, as one .npz (flushed to disk)."""
    arrays = {key("param", name): p.data for name, p in params.items()}
    for name, m in moments.items():
        arrays.update({key(kind, name): file_bits(m[kind]) for kind in MOMENTS})
    arrays["rng"] = np.array(rng_json)
    arrays.update(states)
    write_durably(path, lambda f: np.savez(f, **arrays))


def save_checkpoint(directory, model, *, step, extra=None, keep=2, replace_after=None):
    """Save the `ParallelModel` `model` (its parameters, its optimizer's state, its random
    streams) after `step` as DIR/step_XXXXXX (collective: every rank calls it).

    The manifest keeps model.config (checked on resume), model.layout() and `extra`
    (a JSON-able dict: the data sampler's state, ...). The newest `keep` complete
    checkpoints are kept. `replace_after=S`: the checkpoints in DIR newer than S are another
    run's, which this one replaces (--overwrite); they are deleted once this save is
    published, not before. Returns the step directory's Path.
    """
    if keep < 1:  # checked on every rank, before any rank writes
        raise ValueError(f"keep={keep}: at least the newest checkpoint must be kept")
    mesh, optimizer = model.mesh, model.optimizer
    world, root = mesh.world, Path(directory)
    final = root / step_name(step)
    replacing = replace_after is not None and step > replace_after
    if final.exists() and not replacing:  # checked on every rank, so every rank raises
        raise CheckpointError(f"checkpoint {final} already exists; save step {step} elsewhere or remove it")
    tmp = root / (step_name(step) + ".tmp")
    began = attempt(lambda: str(begin_save(root, step))) if world.rank == 0 else None
    fail_together(all_gather_json(world, began), tmp, world)  # no rank writes before the directory exists
    params = named_parameters(model)
    moments = moments_by_name(optimizer, params)
    path = tmp / shard_name(world.rank)

    def write_and_describe():
        write_shard(path, params, moments, rng_state_json(model), rank_states(model))
        record = rank_record(path, world.rank, mesh.coords._asdict(), params, moments)
        return {**record, "step_states": {name: update.state_dict() for name, update in model.step_updates}}
    with model.full_parameters():  # ZeRO-3: each rank writes its whole local arrays, like any layout
        records = all_gather_json(world, attempt(write_and_describe))
    fail_together(records, tmp, world)
    fp8 = fp8_scales(model, world)
    outcome = None
    if world.rank == 0:
        outer = model.outer  # local SGD's: every replica saved its own state
        optim = {"type": optimizer_type(optimizer), "moment_dtype": moment_dtype(optimizer),
                 "defaults": dict(optimizer.defaults) if optimizer is not None else None,
                 "scaler": model.amp.scaler.state_dict() if model.amp is not None else None, "fp8": fp8,
                 "outer": outer.hyperparameters() if outer is not None else None}
        manifest = build_manifest(records, step, model.config, model.layout(), mesh.sizes(), optim, extra or {})

        def publish():
            write_manifest(tmp, manifest)
            commit_save(tmp, step, keep, replace_after)
        outcome = attempt(publish)
    fail_together(all_gather_json(world, outcome), tmp, world)  # also: nobody returns before publication
    return final


def fp8_scales(model, world):
    """The delayed FP8 scales of every pipeline stage, by layer and role (a collective; None
    without an FP8 policy). The ranks of a stage hold the same ones: their MAX was agreed."""
    if model.amp is None or model.amp.fp8 is None:
        return None
    return {name: state for part in all_gather_json(world, model.amp.fp8.state_dict()) for name, state in part.items()}


def attempt(action):
    """action()'s result, or {"error": what went wrong} if it raised OSError (disk full, ...)."""
    try:
        return action()
    except OSError as error:
        return {"error": f"{type(error).__name__}: {error}"}


def fail_together(records, tmp, world):
    """If any rank's record is an error, every rank raises the same CheckpointError (rank 0
    first removes the failed save's directory); the model and optimizer are untouched."""
    failed = [(rank, r["error"]) for rank, r in enumerate(records) if isinstance(r, dict) and "error" in r]
    if not failed:
        return
    rank, error = failed[0]
    where = abandon_save(tmp) if world.rank == 0 else last_good(tmp.parent)
    raise CheckpointError(f"saving {tmp.with_suffix('').name} failed on rank {rank} ({error}); "
                          f"removed {tmp}; {where}")
