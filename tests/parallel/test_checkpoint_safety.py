"""Checkpoints never lose the last good state and never load a wrong one: pruning below an
earlier run's checkpoints, a save that fails half way, a manifest that was edited."""
import errno
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import parallel
from parallel import run_threads
from parallel.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
from ckpt_common import hybrid, train  # noqa: E402


def save_steps(directory, steps, layout=(1, 1, 1), keep=2):
    """One run in `layout` that trains and saves after each step in `steps`."""
    def body():
        model = hybrid(*layout)
        for step in steps:
            train(model, [step])
            save_checkpoint(directory, model, step=step, keep=keep)
    run_threads(int(np.prod(layout)), body)


def listing(directory):
    return sorted(p.name for p in Path(directory).iterdir())


# --- pruning ----------------------------------------------------------------------------------

def test_saving_below_an_earlier_runs_checkpoints_keeps_the_one_just_written(tmp_path):
    save_steps(tmp_path, [20, 40])
    save_steps(tmp_path, [5, 10])  # a shorter run into the same directory
    assert (tmp_path / "latest").read_text().strip() == "step_000010"
    assert listing(tmp_path) == ["latest", "step_000005", "step_000010", "step_000020", "step_000040"]
    assert run_threads(1, lambda: load_checkpoint(tmp_path, hybrid())["step"]) == [10]
    save_steps(tmp_path, [15])  # the third save prunes step 5, below it, and nothing above
    assert listing(tmp_path) == ["latest", "step_000010", "step_000015", "step_000020", "step_000040"]


# --- a save that fails ------------------------------------------------------------------------

def test_a_failed_save_removes_its_tmp_keeps_latest_and_the_model(tmp_path, monkeypatch):
    from parallel.checkpoint import save as save_module
    write_shard = save_module.write_shard

    def disk_full_on_rank_1(path, *args):
        if parallel.world().rank == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write_shard(path, *args)

    def body():
        model = hybrid(2, 1, 1)
        train(model, [0])
        save_checkpoint(tmp_path, model, step=1)
        train(model, [1])
        before = [p.data.copy() for p in model.parameters()]
        monkeypatch.setattr(save_module, "write_shard", disk_full_on_rank_1)
        with pytest.raises(CheckpointError) as failed:
            save_checkpoint(tmp_path, model, step=2)
        parallel.world().barrier()
        monkeypatch.setattr(save_module, "write_shard", write_shard)
        unchanged = all(np.array_equal(a, p.data) for a, p in zip(before, model.parameters()))
        save_checkpoint(tmp_path, model, step=2)  # the same step saves once there is room again
        return str(failed.value), unchanged

    for message, unchanged in run_threads(2, body):
        assert unchanged and "\n" not in message
        assert "saving step_000002 failed on rank 1" in message and "No space left on device" in message
        assert f"the last good checkpoint is {tmp_path / 'step_000001'}" in message
    assert listing(tmp_path) == ["latest", "step_000001", "step_000002"]


def test_a_leftover_tmp_of_a_crashed_save_is_replaced(tmp_path):
    (tmp_path / "step_000001.tmp").mkdir(parents=True)
    (tmp_path / "step_000001.tmp" / "rank_00007.npz").write_bytes(b"half a shard")
    save_steps(tmp_path, [1])
    assert listing(tmp_path) == ["latest", "step_000001"]
    assert "rank_00007.npz" not in listing(tmp_path / "step_000001")


# --- the manifest is checked ------------------------------------------------------------------

def seal(step_dir):
    """Rewrite manifest.sha256 for the edited manifest (as a buggy writer would have)."""
    digest = hashlib.sha256((step_dir / "manifest.json").read_bytes()).hexdigest()
    (step_dir / "manifest.sha256").write_text(digest + "\n")


def edit(step_dir, change):
    path = step_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest, indent=1))


def swap_tp_pieces(manifest):
    pieces = manifest["tensors"]["blocks.0.attn.q.weight"]["pieces"]
    pieces[0]["tp"], pieces[1]["tp"] = pieces[1]["tp"], pieces[0]["tp"]


def set_tp_axis(manifest):
    manifest["tensors"]["blocks.0.attn.q.weight"]["tp_axis"] = 1


def set_mesh(manifest):
    manifest["mesh"], manifest["world_size"] = {"dp": 2, "tp": 1, "pp": 1}, 2


def drop_file(manifest):
    del manifest["files"]["rank_00001.npz"]


def load_errors(directory, layout=(1, 2, 1)):
    """Each rank's CheckpointError from loading, and whether its parameters stayed put."""
    def body():
        model = hybrid(*layout)
        before = [p.data.copy() for p in model.parameters()]
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(directory, model)
        return str(error.value), all(np.array_equal(a, p.data) for a, p in zip(before, model.parameters()))
    return run_threads(int(np.prod(layout)), body)


def test_an_edited_manifest_fails_its_checksum(tmp_path):
    save_steps(tmp_path, [1], layout=(1, 2, 1))
    step_dir = tmp_path / "step_000001"
    edit(step_dir, swap_tp_pieces)
    for message, unchanged in load_errors(tmp_path):
        assert unchanged and f"{step_dir / 'manifest.json'} fails its SHA-256 checksum" in message


@pytest.mark.parametrize("change, field", [
    (swap_tp_pieces, "tensors['blocks.0.attn.q.weight'].pieces (file rank_00000.npz) has dp=0 tp=1 pp=0"),
    (set_tp_axis, "tensors['blocks.0.attn.q.weight'].pieces (file rank_00000.npz) has shape [8, 16], impossible"),
    (set_mesh, "files['rank_00001.npz'] has rank 1 at dp=0 tp=1 pp=0, which is not its place"),
    (drop_file, "files does not list the shard"),
], ids=["tp-coordinates-swapped", "tp_axis-changed", "mesh-changed", "file-entry-removed"])
def test_a_manifest_that_disagrees_with_itself_or_the_shards_is_refused(tmp_path, change, field):
    save_steps(tmp_path, [1], layout=(1, 2, 1))
    step_dir = tmp_path / "step_000001"
    edit(step_dir, change)
    seal(step_dir)  # the checksum matches: only the cross-checks can catch it
    for message, unchanged in load_errors(tmp_path):
        assert unchanged and f"the manifest {step_dir / 'manifest.json'}: {field}" in message, message


def test_keep_below_one_is_refused_before_anything_is_written(tmp_path):
    def body():
        with pytest.raises(ValueError, match="keep=0: at least the newest checkpoint must be kept"):
            save_checkpoint(tmp_path / "ckpt", hybrid(), step=1, keep=0)
    run_threads(1, body)
    assert not (tmp_path / "ckpt").exists()


def test_a_possible_piece_is_ceil_of_the_full_size_over_tp_along_tp_axis():
    from parallel.checkpoint.manifest import possible_piece
    assert possible_piece([2, 16], [13, 16], 0, 8)  # vocabulary 13 padded to 16 over tp=8: the last piece is padding
    assert possible_piece([13, 16], [13, 16], None, 8)
    assert not possible_piece([1, 16], [13, 16], 0, 8)
    assert not possible_piece([2, 8], [13, 16], 0, 8)
    assert not possible_piece([13, 8], [13, 16], None, 2)
