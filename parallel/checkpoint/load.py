"""`load_checkpoint`: fill a model and optimizer, built for ANY layout, from a checkpoint.

    1. find the step directory (DIR/latest, or a step directory) and read the manifest
    2. check it is this model (config) and that the config can take this layout
    3. verify every shard file (size, SHA-256; each file on one rank) and agree on the
       first bad one, so all ranks raise alike
    4. rebuild each dense tensor, cut this rank's piece, and only then assign them all
    5. in the same layout, restore this rank's random generators too (in another layout
       the dropout streams cannot continue: the masks are drawn per rank and shard), and
       its per-rank states: the communication hook's (error feedback is per rank and
       bucket) and local SGD's outer optimizer
    6. in any layout, the state each module moves after a step (a MoE layer's loss-free
       balancing bias: the manifest's step_states, by module name)

A local SGD checkpoint (manifest optimizer.outer) is the exception to "any layout": between
outer steps every dp replica has its own parameters and AdamW moments, so it resumes in the
layout it was saved in, each rank from its own file. A plain checkpoint loaded into a local
SGD run starts its first outer period from the loaded parameters.

Loading never writes to disk.
"""
import threading

import numpy as np

from minitensor.narrow_moments import moment_dtype_of

from ..tensor_parallel.sharding import dense_shape
from .files import CheckpointError, resolve, shard_name
from .manifest import check_config, check_layout, read_manifest, verify_files
from .reshard import dense, has_moments, key, local_piece
from .state import (
    MOMENTS,
    load_moments,
    named_parameters,
    rank_state_holders,
    set_rank_states,
    set_rng_state_json,
)


def open_manifest(path):
    """(step directory, manifest) of the checkpoint at `path` (a root with `latest`, or a step)."""
    step_dir = resolve(path)
    return step_dir, read_manifest(step_dir)


def check_entries(manifest, params, step_dir, master_dtype=None):
    """The manifest entry of every local name; a CheckpointError names a missing or mismatched one.
    `master_dtype`: the dtype the masters have (ZeRO-2/3 under a mixed policy keep them only as
    float32 chunks, and the parameters standing for them by name compute in 16 bits)."""
    entries = {}
    for name, p in params.items():
        entry = manifest["tensors"].get(name)
        if entry is None:
            raise CheckpointError(f"the checkpoint {step_dir} has no tensor '{name}'")
        full_shape, dtype = list(dense_shape(p)), str(master_dtype or p.dtype)
        if entry["full_shape"] != full_shape or entry["dtype"] != dtype:
            raise CheckpointError(f"'{name}' is {entry['dtype']} {tuple(entry['full_shape'])} in the checkpoint "
                                  f"{step_dir}, {dtype} {tuple(full_shape)} in the model")
        entries[name] = entry
    return entries


def same_layout(manifest, dims, world, entries):
    """Saved by this very layout: same mesh, and this rank's own file holds exactly its names."""
    own = shard_name(world.rank)
    mine = {name for name, e in entries.items() if any(p["file"] == own for p in e["pieces"])}
    saved = {"cp": 1, **manifest["mesh"]}  # a manifest from before the cp axis
    return saved == dims and manifest["world_size"] == world.size and mine == set(entries)


# numpy parses each array's .npy header with ast.literal_eval, and CPython before 3.11.5
# could fail ("AST constructor recursion depth mismatch") when threads parse at once: the
# ranks of run_threads read one array at a time.
_READ_LOCK = threading.Lock()


class ShardReader:
    """read(file, key) -> array, opening each .npz once (lazily: only the keys asked for are read).
    `moment_dtype`: the saved moments' dtype, which their bits are viewed as (bfloat16, saved as uint16)."""

    def __init__(self, step_dir, moment_dtype=None):
        self.step_dir, self.open = step_dir, {}
        self.moment_dtype = moment_dtype_of(moment_dtype, np.float64) if moment_dtype else None

    def __call__(self, file, key):
        with _READ_LOCK:
            if file not in self.open:
                self.open[file] = np.load(self.step_dir / file, allow_pickle=False)
            array = self.open[file][key]
        return array.view(self.moment_dtype) if self.moment_dtype and key.startswith(MOMENTS) else array

    def keys(self, file, prefix):
        """The keys of `file` that start with `prefix`."""
        with _READ_LOCK:
            if file not in self.open:
                self.open[file] = np.load(self.step_dir / file, allow_pickle=False)
            return [k for k in self.open[file].files if k.startswith(prefix)]

    def close(self):
        for npz in self.open.values():
            npz.close()


def check_replicas(manifest, model, resharded, step_dir):
    """A local SGD checkpoint (its replicas differ) resumes only into local SGD in its own layout."""
    outer = manifest["optimizer"].get("outer")
    if outer is None:
        return False
    saved = ", ".join(f"{axis}={size}" for axis, size in manifest["mesh"].items())
    if model.outer is None or resharded:
        raise CheckpointError(f"the checkpoint {step_dir} is of local SGD (local_steps={outer['local_steps']}): "
                              f"each dp replica saved its own parameters and AdamW moments, so it resumes only "
                              f"with local SGD in the layout it was saved in ({saved}, {manifest['world_size']} "
                              f"ranks)")
    return True


def own_replica(entries, read, own):
    """(parameters, moments) of this rank's replica from its own file (same layout)."""
    values = {name: read(own, key("param", name)) for name in entries}
    moments = {name: (e["step"], *(read(own, key(kind, name)) for kind in MOMENTS))
               for name, e in entries.items() if has_moments(e)}
    return values, moments


def load_checkpoint(path, model):
    """Load the checkpoint at `path` into this rank's part of the `ParallelModel` `model`:
    parameters (the masters under a mixed precision policy), the optimizer's state
    (model.optimizer, if any), the loss scaler's state and, in the same layout, the random
    streams (collective). The layout may differ from the saving one.
    Returns {"step": steps done, "extra": the saved extra, "path": the step directory,
    "resharded": layout differs (RNG not restored), "manifest"}.
    """
    mesh, optimizer = model.mesh, model.optimizer
    step_dir, manifest = open_manifest(path)
    check_config(manifest, model.config, step_dir)
    check_layout(model.config, mesh.tp, mesh.pp)
    params = named_parameters(model)
    entries = check_entries(manifest, params, step_dir, model.amp.policy.master_dtype if model.amp else None)
    resharded = not same_layout(manifest, mesh.sizes(), mesh.world, entries)
    own = shard_name(mesh.world.rank)
    replicas_differ = check_replicas(manifest, model, resharded, step_dir)
    verify_files(mesh.world, step_dir, manifest)
    read = ShardReader(step_dir, manifest["optimizer"].get("moment_dtype"))  # older checkpoints: the params' dtype
    try:
        if replicas_differ:
            values, moments = own_replica(entries, read, own)
        else:
            values = {name: local_piece(dense(e, "param", name, read), params[name], mesh.tp_group)
                      for name, e in entries.items()}
            moments = {name: (e["step"], *(local_piece(dense(e, kind, name, read), params[name], mesh.tp_group)
                                           for kind in MOMENTS))
                       for name, e in entries.items() if has_moments(e)}
        rng = None if resharded else str(read(own, "rng"))
        states = {} if resharded else {k: read(own, k) for prefix in rank_state_holders(model) for k in read.keys(own, prefix)}
    finally:
        read.close()
    with model.full_parameters(writeback=True):  # ZeRO-2/3: this rank keeps its chunk of them
        for name, p in params.items():
            p.data[...] = values[name]
    model.master_parameters_changed()
    if optimizer is not None and manifest["optimizer"]["defaults"] is not None:
        load_moments(optimizer, params, moments, manifest["optimizer"]["defaults"])
    saved_scaler = manifest["optimizer"].get("scaler")  # older checkpoints have none
    if saved_scaler and saved_scaler["enabled"] and model.amp is not None and model.amp.scaler.enabled:
        model.amp.scaler.load_state_dict(saved_scaler)
    if model.amp is not None and model.amp.fp8 is not None:  # the amax histories resume where they were
        model.amp.fp8.load_state_dict(manifest["optimizer"].get("fp8") or {})
    if rng is not None:
        set_rng_state_json(model, rng)
    if model.outer is not None and not replicas_differ:
        model.outer.restart()  # a plain checkpoint: the first outer period starts from its parameters
    set_rank_states(model, states)
    for name, update in model.step_updates:  # by module name, so in any layout (older checkpoints have none)
        if name in manifest.get("step_states", {}):
            update.load_state_dict(manifest["step_states"][name])
    return {"step": manifest["step"], "extra": manifest["extra"], "path": step_dir, "resharded": resharded,
            "manifest": manifest}
