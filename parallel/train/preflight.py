"""What must hold on disk before the first step: the checkpoint to resume, the --save
directory, the --trace file. Each problem is a ValueError naming the flag, raised before
any training, so a run never trains to the end to fail at its first write.

The rule for --save DIR (nothing good is ever deleted without being asked):

    a fresh run                 DIR must hold no checkpoint
    resuming from DIR's own     DIR must hold none newer than the resumed step S (they would
    step S (--resume DIR...)    clash with the steps this run writes, or be another run's)
    resuming from elsewhere     DIR must hold no checkpoint

--overwrite deletes the checkpoints that break the rule (all of DIR's, or those newer
than S), on rank 0, before training. Pruning after a save then only ever sees this run's
lineage (parallel/checkpoint/files.py: it never deletes a checkpoint newer than the one
just written).
"""
import os
import tempfile
from pathlib import Path

from ..checkpoint.files import checkpoints_after, remove_after


def check_outputs(args, rank):
    """Check --resume, --save and --trace; with --overwrite, rank 0 deletes the checkpoints in
    the way. Returns the deleted paths (on rank 0)."""
    resumed_dir, start = resume_point(args)
    removed = check_save_dir(args, resumed_dir, start, rank) if args.save else []
    if args.trace:
        check_trace(Path(args.trace))
    return removed


def resume_point(args):
    """(step directory, step) of the --resume checkpoint (manifest checked), or (None, 0)."""
    if not args.resume:
        return None, 0
    from ..checkpoint import open_manifest  # (as in loop.py: plain training does without it)
    step_dir, manifest = open_manifest(args.resume)
    step = manifest["step"]
    if step >= args.steps:
        raise ValueError(f"--resume {args.resume} is at step {step} and --steps={args.steps} is the total: "
                         f"nothing left to train (give --steps above {step})")
    return step_dir, step


def check_save_dir(args, resumed_dir, start, rank):
    root = Path(args.save)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--save {root} is a file, not a directory")
    probe_writable(root, "--save", create=True)
    continuing = resumed_dir is not None and resumed_dir.parent.resolve() == root.resolve()
    after = start if continuing else -1
    clash = [path.name for _, path in checkpoints_after(root, after)]
    if clash and not args.overwrite:
        if continuing:
            raise ValueError(f"--save {root} holds {', '.join(clash)}, newer than the resumed step {start}; "
                             f"pass --overwrite to delete them first, or save elsewhere")
        raise ValueError(f"--save {root} already holds checkpoints ({', '.join(clash)}); resume them with "
                         f"--resume {root}, pass --overwrite to delete them first, or save elsewhere")
    return remove_after(root, after) if clash and rank == 0 else []


def check_trace(path):
    if path.is_dir():
        raise ValueError(f"--trace {path} is a directory; give a file name such as {path / 'trace.json'}")
    if not path.parent.is_dir():
        raise ValueError(f"--trace {path}: the directory {path.parent} does not exist")
    probe_writable(path.parent, "--trace", create=False)


def probe_writable(directory, flag, create):
    """Create (and remove) a file in `directory`, made first if `create`: the only test of
    writability that holds for root too (os.access says yes to root on a read-only mode)."""
    try:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=directory, prefix=".write-probe-")
        os.close(handle)
        os.unlink(name)
    except OSError as error:
        raise ValueError(f"{flag}: cannot write into {directory}: {error.strerror or error}") from None
