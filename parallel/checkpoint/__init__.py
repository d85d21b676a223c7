"""Distributed checkpoints: every rank saves its shard by single-device name, rank 0 a
manifest; any layout can load any checkpoint of the same model.

    files.py     directory layout, atomic publication (tmp dir + rename, `latest`), pruning
    state.py     a rank's parameters, AdamW / ZeRO moments and RNG streams by name
    manifest.py  the JSON manifest: config, layout, checksums, who holds which piece
    reshard.py   dense tensors from saved pieces, and this rank's piece of them
    save.py      save_checkpoint
    load.py      load_checkpoint

    path = save_checkpoint(DIR, model, step=step, extra={...})   # optimizer, mesh, config: model's
    resume = load_checkpoint(DIR, model)                         # resume["step"], resume["extra"]
"""
from .files import CheckpointError, complete_steps
from .load import load_checkpoint, open_manifest
from .manifest import check_layout
from .save import save_checkpoint

__all__ = ["CheckpointError", "check_layout", "complete_steps", "load_checkpoint", "open_manifest",
           "save_checkpoint"]
