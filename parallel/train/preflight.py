"""What must hold on disk before the first step: the checkpoint to resume, the --save
directory, the --trace file. Each problem is a ValueError naming the flag, raised before
any training (before any rank builds a model), so a run never trains to the end to fail at
its first write, nor builds a model to find the checkpoint is of another.

The checkpoint to resume must be of this run's model (its config), dtype and --local-steps.

The rule for --save DIR (nothing good is ever deleted without being asked):

    a fresh run                 DIR must hold no checkpoint
    resuming from DIR's own     DIR must hold none newer than the resumed step S (they would
    step S (--resume DIR...)    clash with the steps this run writes, or be another run's)
    resuming from elsewhere     DIR must hold no checkpoint

--overwrite lets the run go on despite the checkpoints that break the rule (all of DIR's,
or those newer than S); they are deleted only after this run has published its first
checkpoint (parallel.checkpoint.save_checkpoint's replace_after), so a run that fails
before that loses nothing. Pruning after a save then only ever sees this run's lineage
(parallel/checkpoint/files.py: it never deletes a checkpoint newer than the one just written).
"""
import os
import resource
import tempfile
from pathlib import Path

import numpy as np

from ..checkpoint.files import checkpoints_after
from ..checkpoint.manifest import check_config
from ..plan.model import dense_param_count


def check_outputs(args, config):
    """Check --resume against this run (its model `config`, dtype and flags), --save and --trace.
    Returns the notices to print once: what --overwrite will replace, a precision that changed."""
    check_memory(args, config)
    manifest = resume_manifest(args, config)
    notices = precision_notice(args, manifest)
    if args.save:
        notices += check_save_dir(args)
    if args.trace:
        check_trace(Path(args.trace))
    return notices


def check_memory(args, config):
    """Weights, gradients and two AdamW moments are at least 4·N numbers over all ranks, and this
    process holds its share of them (all under --threads): refuse when that lower bound exceeds
    the memory the process may use, before a model of a million experts is built for a MemoryError."""
    share = 1 if args.threads else 1 / (args.dp * args.tp * args.pp * args.cp)
    need = 4 * dense_param_count(config) * np.dtype(args.dtype).itemsize * share
    limit = usable_memory()
    if need > limit:
        raise ValueError(f"the model's {dense_param_count(config):,} parameters need at least {need / 2**30:,.3g} GiB "
                         f"in each process (weights, gradients, AdamW moments), over the {limit / 2**30:,.3g} GiB "
                         f"it may use: give a smaller model{' or fewer --experts' if args.experts else ''}")


def usable_memory():
    """Bytes this process may use: the machine's memory, or less if an address-space limit is set."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return physical if soft == resource.RLIM_INFINITY else min(physical, soft)


def resume_manifest(args, config):
    """The manifest of the --resume checkpoint, checked against this run, or None."""
    if not args.resume:
        return None
    from ..checkpoint import open_manifest  # (as in loop.py: plain training does without it)
    step_dir, manifest = open_manifest(args.resume)
    step = manifest["step"]
    if step >= args.steps:
        raise ValueError(f"--resume {args.resume} is at step {step} and --steps={args.steps} is the total: "
                         f"nothing left to train (give --steps above {step})")
    check_config(manifest, config, step_dir)
    saved = {entry["dtype"] for entry in manifest["tensors"].values()}
    if saved != {args.dtype}:
        raise ValueError(f"--resume {step_dir} holds {', '.join(sorted(saved))} parameters, but this run's are "
                         f"{args.dtype}: pass --dtype {min(saved)} (under --precision fp16/bf16 the masters are "
                         f"float32)")
    outer = manifest["optimizer"].get("outer")
    if outer is not None and args.local_steps != outer["local_steps"]:
        given = f"--local-steps {args.local_steps}" if args.local_steps is not None else "no --local-steps"
        raise ValueError(f"--resume {step_dir} was saved by local SGD with --local-steps {outer['local_steps']}, "
                         f"and this run has {given}: its replicas' states belong to that period; resume with "
                         f"--local-steps {outer['local_steps']}")
    return manifest


def precision_notice(args, manifest):
    """One line if the resumed run computed under another --precision (allowed: the masters are alike),
    one if it kept AdamW's moments in another dtype (converted: minitensor.narrow_moments)."""
    saved = (manifest or {}).get("extra", {}).get("args", {}).get("precision")
    notes = [] if saved is None or saved == args.precision else [
        f"note: --resume {args.resume} was trained under --precision {saved}; this run continues under "
        f"{args.precision}"]
    moments = (manifest or {}).get("optimizer", {}).get("moment_dtype")
    ours = args.moment_dtype or ("float32" if args.precision in ("fp16", "bf16") else args.dtype)
    if moments is not None and moments != ours:
        how = "exactly" if moments == "bfloat16" else "rounded to nearest even"
        notes.append(f"note: --resume {args.resume} kept AdamW's moments in {moments}; this run keeps them in "
                     f"{ours}, converted {how}")
    return notes


def in_the_way_after(args):
    """The step after which --save DIR's checkpoints are in this run's way: the resumed step S
    if the run continues DIR's own lineage, else -1 (all of them)."""
    if not args.resume:
        return -1
    from ..checkpoint import open_manifest
    step_dir, manifest = open_manifest(args.resume)
    return manifest["step"] if step_dir.parent.resolve() == Path(args.save).resolve() else -1


def check_save_dir(args):
    root = Path(args.save)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--save {root} is a file, not a directory")
    probe_writable(root, "--save", create=True)
    after = in_the_way_after(args)
    clash = [path for _, path in checkpoints_after(root, after)]
    if clash and not args.overwrite:
        names = ", ".join(path.name for path in clash)
        if after >= 0:
            raise ValueError(f"--save {root} holds {names}, newer than the resumed step {after}; "
                             f"pass --overwrite to replace them, or save elsewhere")
        raise ValueError(f"--save {root} already holds checkpoints ({names}); resume them with "
                         f"--resume {root}, pass --overwrite to replace them, or save elsewhere")
    return [f"--overwrite: {path} will be deleted once this run has saved its first checkpoint" for path in clash]


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
