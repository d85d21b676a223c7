"""Where a checkpoint lives on disk, and how a new one appears all at once.

    DIR/step_000120/          a complete checkpoint: one shard per rank + the manifest
        rank_00000.npz ...
        manifest.json         written last, by rank 0, once every shard is on disk
    DIR/step_000123.tmp/      a save in progress (or one that crashed): never read
    DIR/latest                the name of the newest complete step directory

A save writes everything into `step_XXXXXX.tmp`, then renames the directory (one
atomic `rename` on POSIX file systems) and only then rewrites `latest` (written to
`latest.tmp`, then `os.replace`d over it, also atomic). A crash at any moment leaves
`latest` naming a whole checkpoint; the older ones are pruned only after that.
Every file is flushed and fsync'ed before the rename that publishes it.
"""
import hashlib
import os
import re
import shutil
from pathlib import Path

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_PATTERN = re.compile(r"step_(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing, corrupt, or for another model or layout."""


def step_name(step):
    return f"step_{step:06d}"


def shard_name(rank):
    return f"rank_{rank:05d}.npz"


def fsync_dir(path):
    """Make a rename or a new entry in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path, write):
    """Call write(file) on `path` opened for binary writing, then flush and fsync it."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def sha256_of(path, block=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def begin_save(root, step):
    """Rank 0, before any shard is written: an empty `step_XXXXXX.tmp` in root (a leftover
    of a crashed save of the same step is removed)."""
    root = Path(root)
    tmp = root / (step_name(step) + ".tmp")
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def commit_save(tmp, keep):
    """Rank 0, after every shard and the manifest are durable: publish, point latest, prune."""
    tmp = Path(tmp)
    root, final = tmp.parent, tmp.with_suffix("")
    os.rename(tmp, final)
    fsync_dir(root)
    point_latest(root, final.name)
    prune(root, keep)
    return final


def point_latest(root, name):
    tmp = Path(root) / (LATEST + ".tmp")
    write_durably(tmp, lambda f: f.write(name.encode() + b"\n"))
    os.replace(tmp, Path(root) / LATEST)
    fsync_dir(root)


def complete_steps(root):
    """[(step, path)] of the complete checkpoints in root, oldest first."""
    found = []
    for path in Path(root).iterdir():
        match = STEP_PATTERN.fullmatch(path.name)
        if match and path.is_dir() and (path / MANIFEST).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def prune(root, keep):
    """Delete all but the newest `keep` complete checkpoints."""
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest checkpoint must be kept")
    for _, path in complete_steps(root)[:-keep]:
        shutil.rmtree(path)


def resolve(path):
    """The step directory to load: `path` itself if it holds a manifest, else the one
    `path/latest` names."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    pointer = path / LATEST
    if not pointer.is_file():
        raise CheckpointError(f"no checkpoint at {path}: neither {path / MANIFEST} nor {pointer} exists")
    target = path / pointer.read_text().strip()
    if not (target / MANIFEST).is_file():
        raise CheckpointError(f"{pointer} names {target.name}, but {target / MANIFEST} does not exist")
    return target
