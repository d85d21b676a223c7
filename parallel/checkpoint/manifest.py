"""The manifest: one JSON file that says what a checkpoint holds and where.

    {"format": "minitensor-parallel-checkpoint", "version": 1, "step": 120,
     "config": {GPTConfig fields}, "layout": {what the caller passed: dp, tp, pp, m, schedule, ...},
     "mesh": {"dp": 2, "tp": 2, "pp": 2}, "world_size": 8,
     "optimizer": {"type": "AdamW" | "ZeroOptimizer" | null, "defaults": {lr, betas, eps, weight_decay}},
     "extra": {what the caller passed: data sampler state, ...},
     "files": {"rank_00005.npz": {"rank": 5, "dp": 0, "tp": 1, "pp": 1, "bytes": ..., "sha256": ...}},
     "tensors": {"blocks.3.attn.q.weight": {
         "full_shape": [64, 64], "tp_axis": 0, "dtype": "float64", "step": 120,
         "pieces": [{"file": "rank_00004.npz", "dp": 0, "tp": 0, "pp": 1, "shape": [32, 64],
                     "moments": null | [lo, hi]}, ...]}}}

A piece is one rank's local array of the name; `moments` is null when its AdamW moments
are whole arrays of `shape`, [lo, hi) when they are that rank's ZeRO range of the
flattened local array, absent when the rank has no moments for it.
Every rank builds its own record (what its file holds); the records are all-gathered
(buffer collectives only: JSON as bytes) and rank 0 writes their union.
"""
import dataclasses
import json

import numpy as np

from ..tensor_parallel.sharding import dense_shape, tp_axis
from .files import MANIFEST, CheckpointError, sha256_of

FORMAT, VERSION = "minitensor-parallel-checkpoint", 1


def rank_record(path, rank, coords, params, moments):
    """What this rank's shard file holds: coordinates, size, checksum, and per name its piece."""
    tensors = {}
    for name, p in params.items():
        piece = {"shape": list(p.shape)}
        if name in moments:
            piece["moments"] = moments[name]["range"]
        tensors[name] = {"piece": piece, "dtype": str(p.dtype), "tp_axis": tp_axis(p),
                         "full_shape": list(dense_shape(p)),
                         "step": moments[name]["step"] if name in moments else None}
    return {"file": path.name, "rank": rank, **coords, "bytes": path.stat().st_size,
            "sha256": sha256_of(path), "tensors": tensors}


def build_manifest(records, step, config, layout, mesh_dims, optimizer, extra):
    tensors = {}
    for record in records:
        where = {"file": record["file"], "dp": record["dp"], "tp": record["tp"], "pp": record["pp"]}
        for name, t in record["tensors"].items():
            entry = tensors.setdefault(name, {"full_shape": t["full_shape"], "tp_axis": t["tp_axis"],
                                              "dtype": t["dtype"], "step": t["step"], "pieces": []})
            entry["pieces"].append({**where, **t["piece"]})
            if entry["step"] is None:  # under ZeRO only the dp ranks whose range covers it know
                entry["step"] = t["step"]
    files = {r["file"]: {k: r[k] for k in ("rank", "dp", "tp", "pp", "bytes", "sha256")} for r in records}
    return {"format": FORMAT, "version": VERSION, "step": step, "config": config_dict(config),
            "layout": layout, "mesh": mesh_dims, "world_size": len(records), "optimizer": optimizer,
            "extra": extra, "files": files, "tensors": tensors}


def config_dict(config):
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def read_manifest(step_dir):
    path = step_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"cannot read the manifest {path}: {error}") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{path} is not a {FORMAT} manifest of version {VERSION}")
    return manifest


def check_config(manifest, config, step_dir):
    """A CheckpointError naming every field in which the checkpoint's model differs."""
    saved, given = manifest["config"], config_dict(config)
    differ = [f"{k}: checkpoint {saved.get(k)!r}, model {given.get(k)!r}"
              for k in sorted(set(saved) | set(given)) if saved.get(k) != given.get(k)]
    if differ:
        raise CheckpointError(f"the checkpoint {step_dir} is of another model: " + "; ".join(differ))


def check_layout(config, tp=1, pp=1, chunks=1):
    """A CheckpointError unless the model `config` can be cut tp-ways and into pp·chunks stages."""
    config = config_dict(config)
    for what in ("n_head", "d_model"):
        if config[what] % tp:
            raise CheckpointError(f"cannot load into tp={tp}: {what}={config[what]} is not divisible by tp={tp}")
    if pp * chunks > config["n_layer"]:
        raise CheckpointError(f"cannot load into pp={pp} x chunks={chunks} stages: "
                              f"n_layer={config['n_layer']} blocks")


PROBLEMS = ("is missing", "has a size other than the manifest's", "fails its SHA-256 checksum (corrupt)")


def file_problem(step_dir, name, facts):
    """Index into PROBLEMS of what is wrong with one shard file, or None."""
    path = step_dir / name
    if not path.is_file():
        return 0
    if path.stat().st_size != facts["bytes"]:
        return 1
    if sha256_of(path) != facts["sha256"]:
        return 2
    return None


def verify_files(group, step_dir, manifest):
    """Check every shard file of the checkpoint, each on one rank (round robin: one pass over
    the files in all); every rank raises the same CheckpointError, naming the lowest-numbered
    bad file, if any rank found one (an all-reduce of the first problem)."""
    names = sorted(manifest["files"])
    worst = len(names) * len(PROBLEMS)
    problems = [(index, file_problem(step_dir, name, manifest["files"][name]))
                for index, name in enumerate(names) if index % group.size == group.rank]
    code = min([index * len(PROBLEMS) + problem for index, problem in problems if problem is not None] or [worst])
    code = int(group.all_reduce(np.array([code], dtype=np.int64), op="min")[0])
    if code < worst:
        name, problem = names[code // len(PROBLEMS)], PROBLEMS[code % len(PROBLEMS)]
        raise CheckpointError(f"checkpoint shard {step_dir / name} {problem}; nothing was loaded")
