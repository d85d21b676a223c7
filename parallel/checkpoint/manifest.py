"""The manifest: one JSON file that says what a checkpoint holds and where.

    {"format": "minitensor-parallel-checkpoint", "version": 1, "step": 120,
     "config": {GPTConfig fields}, "layout": {what the caller passed: dp, tp, pp, m, schedule, ...},
     "mesh": {"dp": 2, "tp": 2, "pp": 2, "cp": 1}, "world_size": 8,
     "optimizer": {"type": "AdamW" | "ZeroOptimizer" | null, "defaults": {lr, betas, eps, weight_decay},
                   "scaler": the loss scaler's state (minitensor.amp.GradScaler.state_dict),
                   "outer": null | local SGD's {local_steps, outer_lr, outer_momentum, nesterov}:
                            the dp replicas' files hold different parameters and moments},
     "extra": {what the caller passed: data sampler state, ...},
     "files": {"rank_00005.npz": {"rank": 5, "dp": 0, "tp": 1, "pp": 1, "cp": 0, "bytes": ..., "sha256": ...}},
     "tensors": {"blocks.3.attn.q.weight": {
         "full_shape": [64, 64], "tp_axis": 0, "dtype": "float64", "step": 120,
         "pieces": [{"file": "rank_00004.npz", "dp": 0, "tp": 0, "pp": 1, "cp": 0, "shape": [32, 64],
                     "moments": null | [lo, hi]}, ...]}}}

A piece is one rank's local array of the name; `moments` is null when its AdamW moments
are whole arrays of `shape`, [lo, hi) when they are that rank's ZeRO range of the
flattened local array, absent when the rank has no moments for it. Context parallelism
replicates every parameter over cp as dp does, so its pieces reshard like dp replicas
(a manifest without cp, from before the fourth axis, reads as cp = 1).
Every rank builds its own record (what its file holds); the records are all-gathered
(buffer collectives only: JSON as bytes) and rank 0 writes their union.

The manifest is not trusted either. Beside it, `manifest.sha256` holds the SHA-256 of its
bytes; reading checks that first, then that the manifest agrees with itself and the
directory: every shard file on disk is listed, every file's coordinates are its rank's
place in the mesh, and every piece lies in a listed file at that file's coordinates with
a shape that its tensor's full_shape and tp_axis allow.
"""
import dataclasses
import hashlib
import json

import numpy as np

from ..mesh import rank_of
from ..tensor_parallel.sharding import dense_shape, tp_axis
from .files import MANIFEST, CheckpointError, sha256_of, shard_name, write_durably

MANIFEST_SUM = "manifest.sha256"
SHARD_GLOB = "rank_*.npz"

FORMAT, VERSION = "minitensor-parallel-checkpoint", 1
AXES = ("dp", "tp", "pp", "cp")


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
        where = {"file": record["file"], **{axis: record[axis] for axis in AXES}}
        for name, t in record["tensors"].items():
            entry = tensors.setdefault(name, {"full_shape": t["full_shape"], "tp_axis": t["tp_axis"],
                                              "dtype": t["dtype"], "step": t["step"], "pieces": []})
            entry["pieces"].append({**where, **t["piece"]})
            if entry["step"] is None:  # under ZeRO only the dp ranks whose range covers it know
                entry["step"] = t["step"]
    files = {r["file"]: {k: r[k] for k in ("rank", *AXES, "bytes", "sha256")} for r in records}
    # state moved after each step outside the gradient, by module name (a MoE layer's loss-free balancing
    # bias and MaxVio): the same on every rank that holds the module, so any holder's copy serves
    step_states = {name: state for r in records for name, state in r["step_states"].items()}
    return {"format": FORMAT, "version": VERSION, "step": step, "config": config_dict(config),
            "layout": layout, "mesh": mesh_dims, "world_size": len(records), "optimizer": optimizer,
            "extra": extra, "files": files, "tensors": tensors, "step_states": step_states}


def config_dict(config):
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def write_manifest(step_dir, manifest):
    """manifest.json and, beside it, manifest.sha256: the checksum of its bytes."""
    data = json.dumps(manifest, indent=1).encode()
    write_durably(step_dir / MANIFEST, lambda f: f.write(data))
    write_durably(step_dir / MANIFEST_SUM, lambda f: f.write(hashlib.sha256(data).hexdigest().encode() + b"\n"))


def read_manifest(step_dir):
    """The manifest of step_dir, checked against its checksum, itself and the shard files."""
    path, sum_path = step_dir / MANIFEST, step_dir / MANIFEST_SUM
    try:
        data, expected = path.read_bytes(), sum_path.read_text().strip()
    except OSError as error:
        raise CheckpointError(f"cannot read the manifest {path} or its checksum: {error}") from None
    if hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointError(f"the manifest {path} fails its SHA-256 checksum in {sum_path}: "
                              f"it was edited or is corrupt; nothing was loaded")
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"cannot read the manifest {path}: {error}") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{path} is not a {FORMAT} manifest of version {VERSION}")
    try:
        check_consistency(manifest, step_dir)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as error:  # a field missing or of the wrong kind
        raise CheckpointError(f"the manifest {path} is malformed: {type(error).__name__} {error}") from None
    return manifest


def inconsistent(step_dir, field, text):
    return CheckpointError(f"the manifest {step_dir / MANIFEST}: {field} {text}; nothing was loaded")


def check_consistency(manifest, step_dir):
    """A CheckpointError naming the first field that disagrees with the mesh, the files on disk
    or the tensors' shapes."""
    mesh, files = manifest["mesh"], manifest["files"]
    dp, tp, pp, cp = (int(mesh.get(axis, 1)) for axis in AXES)
    on_disk = sorted(p.name for p in step_dir.glob(SHARD_GLOB))
    unlisted = [name for name in on_disk if name not in files]
    if unlisted:
        raise inconsistent(step_dir, "files", f"does not list the shard {step_dir / unlisted[0]} on disk")
    if not dp * tp * pp * cp == manifest["world_size"] == len(files):
        axes = f"dp={dp} x tp={tp} x pp={pp}" + (f" x cp={cp}" if cp > 1 else "")
        raise inconsistent(step_dir, "mesh/world_size", f"say {axes} = {dp * tp * pp * cp} and "
                           f"world_size={manifest['world_size']}, but files lists {len(files)} shards")
    for name, facts in files.items():
        cp_rank = facts.get("cp", 0)
        inside = 0 <= facts["dp"] < dp and 0 <= facts["tp"] < tp and 0 <= facts["pp"] < pp and 0 <= cp_rank < cp
        rank = rank_of(facts["dp"], facts["tp"], facts["pp"], dp, tp, cp_rank, cp)
        if not inside or facts["rank"] != rank or name != shard_name(rank):
            where = f" cp={cp_rank}" if cp > 1 else ""
            raise inconsistent(step_dir, f"files[{name!r}]", f"has rank {facts['rank']} at dp={facts['dp']} "
                               f"tp={facts['tp']} pp={facts['pp']}{where}, which is not its place in the "
                               f"dp={dp} tp={tp} pp={pp}" + (f" cp={cp}" if cp > 1 else "") + " mesh")
    for name, entry in manifest["tensors"].items():
        check_pieces(step_dir, name, entry, files, tp)


def check_pieces(step_dir, name, entry, files, tp):
    """Every piece of one tensor is in a listed file, at its coordinates, with a possible shape."""
    full, axis = list(entry["full_shape"]), entry["tp_axis"]
    if axis is not None and not 0 <= axis < len(full):
        raise inconsistent(step_dir, f"tensors[{name!r}].tp_axis", f"is {axis}, but full_shape is {full}")
    for piece in entry["pieces"]:
        field = f"tensors[{name!r}].pieces (file {piece['file']})"
        facts = files.get(piece["file"])
        if facts is None:
            raise inconsistent(step_dir, field, "names a file that files does not list")
        if any(piece.get(k, 0) != facts.get(k, 0) for k in AXES):
            raise inconsistent(step_dir, field, f"has dp={piece['dp']} tp={piece['tp']} pp={piece['pp']}, but its "
                               f"file is at dp={facts['dp']} tp={facts['tp']} pp={facts['pp']}")
        if not possible_piece(piece["shape"], full, axis, tp):
            raise inconsistent(step_dir, field, f"has shape {piece['shape']}, impossible for full_shape {full} "
                               f"with tp_axis={axis} over tp={tp}")


def possible_piece(shape, full, axis, tp):
    """A replicated piece is the full shape; a tp shard is full_shape but along tp_axis, where
    it holds ceil(full / tp) (a vocabulary is padded up to a multiple of tp)."""
    if axis is None:
        return list(shape) == full
    expected = [-(-n // tp) if i == axis else n for i, n in enumerate(full)]
    return list(shape) == expected


def check_config(manifest, config, step_dir):
    """A CheckpointError naming every field in which the checkpoint's model differs. A field
    the checkpoint does not name (saved before the field existed: GPTConfig's n_experts, ...)
    counts as its default, so a dense GPT's checkpoint of then loads into a dense GPT of now."""
    given = config_dict(config)
    defaults = {f.name: f.default for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else {}
    saved = {**{k: v for k, v in defaults.items() if k in given}, **manifest["config"]}
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
