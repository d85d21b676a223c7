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

Pruning never deletes what a resume would need: after saving step N it keeps step N
(now `latest`) and the keep-1 newest checkpoints BELOW N, and never touches one above N
(another run's, or one this run cannot vouch for). A save that fails removes its own
`.tmp` directory and leaves `latest` and every published checkpoint as they were.
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


def commit_save(tmp, step, keep, replace_after=None):
    """Rank 0, after every shard and the manifest are durable: publish, point latest, prune.
    `replace_after=S`: the checkpoints newer than S were another run's; with this one
    published (an older one of the same step moved aside first), they are deleted."""
    tmp = Path(tmp)
    root, final = tmp.parent, tmp.with_suffix("")
    replaced = [path for _, path in checkpoints_after(root, replace_after)] if replace_after is not None else []
    if final in replaced:
        replaced[replaced.index(final)] = final.rename(final.with_name(final.name + ".replaced"))
    os.rename(tmp, final)
    fsync_dir(root)
    point_latest(root, final.name)
    for path in replaced:
        shutil.rmtree(path)
    prune(root, step, keep)
    return final


def abandon_save(tmp):
    """Remove a failed save's directory: `step_N.tmp`, or `step_N` if it was renamed but
    `latest` never came to name it. Returns the message's tail: where the last good one is."""
    tmp = Path(tmp)
    root, final = tmp.parent, tmp.with_suffix("")
    shutil.rmtree(tmp, ignore_errors=True)
    if final.is_dir() and latest_name(root) != final.name:
        shutil.rmtree(final, ignore_errors=True)
    return last_good(root)


def latest_name(root):
    pointer = Path(root) / LATEST
    return pointer.read_text().strip() if pointer.is_file() else None


def last_good(root):
    """'the last good checkpoint is DIR/step_N (named by latest)', or that there is none."""
    name = latest_name(root)
    if name is None:
        return f"there is no earlier checkpoint in {root}"
    return f"the last good checkpoint is {Path(root) / name} (named by {LATEST})"


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


def prune(root, step, keep):
    """After saving `step`: delete the complete checkpoints below it but the newest keep-1.
    Checkpoints above `step` are never touched."""
    older = [path for s, path in complete_steps(root) if s < step]
    for path in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(path)


def checkpoints_after(root, step):
    """[(step, path)] of the complete checkpoints in root newer than `step`."""
    root = Path(root)
    return [(s, path) for s, path in complete_steps(root) if s > step] if root.is_dir() else []


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
