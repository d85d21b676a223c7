"""Distributed checkpoints: exact resume, resharding into other layouts, corruption, atomicity.

Same layout: the resumed run's losses are BITWISE those of the uninterrupted run (float64;
the same arithmetic in the same order, RNG streams restored, dropout on). Other layouts:
equal to the uninterrupted run to 1e-9 relative (reductions run in another order).
"""
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitensor.amp import precision_policy
from minitensor.models.gpt import GPTConfig
from parallel import run_threads
from parallel.checkpoint import CheckpointError, check_layout, load_checkpoint, open_manifest, save_checkpoint
from parallel.checkpoint.state import named_generators

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
from ckpt_common import CONFIG, hybrid, train, train_dense  # noqa: E402
from helpers import assert_close  # noqa: E402
from mpi_launch import REPO, requires_mpiexec, run_mpi  # noqa: E402

WORKER = Path(__file__).parent / "mpi_scripts" / "ckpt_train.py"
STEPS = 4
DROPOUT = GPTConfig(**{**CONFIG.__dict__, "dropout": 0.1})


def threads(layout, fn, *args):
    """run_threads over dp·tp·pp ranks."""
    dp, tp, pp = layout[:3]
    return run_threads(dp * tp * pp, fn, *args)


def save_after(directory, layout, steps, config=CONFIG, **kw):
    """Train `steps` steps in `layout`, save, return rank 0's losses."""
    def body():
        model = hybrid(*layout, config=config, **kw)
        losses = train(model, range(steps), config)
        save_checkpoint(directory, model, step=steps, extra={"note": "half way"})
        return losses
    return threads(layout, body)[0]


def resume(directory, layout, steps, config=CONFIG, **kw):
    """A fresh world in `layout`: load, train up to `steps`; rank 0's (losses, load result)."""
    def body():
        model = hybrid(*layout, config=config, **kw)
        meta = load_checkpoint(directory, model)
        return train(model, range(meta["step"], steps), config), meta
    return threads(layout, body)[0]


def straight(layout, steps, config=CONFIG, **kw):
    return threads(layout, lambda: train(hybrid(*layout, config=config, **kw), range(steps), config))[0]


# --- same layout: exact --------------------------------------------------------------

@pytest.mark.parametrize("layout", [(2, 2, 1, False), (2, 1, 2, True)], ids=["dp2-tp2", "dp2-pp2-zero"])
def test_resume_in_the_same_layout_is_bitwise_identical_with_dropout(tmp_path, layout):
    uninterrupted = straight(layout, STEPS, DROPOUT)
    first = save_after(tmp_path, layout, STEPS // 2, DROPOUT)
    second, meta = resume(tmp_path, layout, STEPS, DROPOUT)
    assert meta["step"] == STEPS // 2 and not meta["resharded"] and meta["extra"] == {"note": "half way"}
    assert first + second == uninterrupted  # bitwise: == on Python floats


def test_rng_streams_matter_for_the_exact_resume(tmp_path):
    """The dropout masks after resuming come from the restored streams: fresh streams differ."""
    layout = (1, 2, 1)
    save_after(tmp_path, layout, 1, DROPOUT)

    def body():
        model = hybrid(*layout, config=DROPOUT)
        load_checkpoint(tmp_path, model)
        restored = train(model, [1], DROPOUT)
        fresh = hybrid(*layout, config=DROPOUT)
        load_checkpoint(tmp_path, fresh)
        just_built = named_generators(hybrid(*layout, config=DROPOUT))
        for where, generator in named_generators(fresh).items():  # forget the restored streams
            generator.bit_generator.state = just_built[where].bit_generator.state
        return restored, train(fresh, [1], DROPOUT)
    restored, unrestored = threads(layout, body)[0]
    assert restored != unrestored


# --- other layouts: resharded ----------------------------------------------------------

@pytest.mark.parametrize("target", [(1, 4, 1, False), (1, 1, 1, False), (4, 1, 2, True), (1, 2, 2, False)],
                         ids=["tp4", "one-process", "dp4-pp2-zero", "tp2-pp2"])
def test_resume_in_another_layout_continues_with_the_same_losses(tmp_path, target):
    uninterrupted = train_dense(STEPS)
    first = save_after(tmp_path, (2, 2, 2, True), STEPS // 2)
    second, meta = resume(tmp_path, target, STEPS)
    assert meta["resharded"]
    assert_close(first + second, uninterrupted)


def test_adamw_checkpoint_resumes_under_zero_and_back(tmp_path):
    uninterrupted = train_dense(STEPS)
    first = save_after(tmp_path, (2, 1, 2, False), 1)  # AdamW, whole moments

    def under_zero():  # load the AdamW moments into ZeRO-1 shards, train a step, save the shards
        model = hybrid(4, 1, 1, zero=True)
        meta = load_checkpoint(tmp_path, model)
        losses = train(model, [meta["step"]])
        save_checkpoint(tmp_path, model, step=meta["step"] + 1)
        return losses
    second = run_threads(4, under_zero)[0]
    third, meta = resume(tmp_path, (1, 2, 1, False), STEPS)  # ZeRO ranges back to AdamW
    assert meta["step"] == 2
    assert_close(first + second + third, uninterrupted)


@pytest.mark.parametrize("target", [(2, 2, 1, 0), (1, 1, 1, 0), (2, 1, 2, 2)], ids=["dp2-tp2", "one-process",
                                                                                  "dp2-pp2-zero2"])
def test_a_zero_3_checkpoint_of_dp4_resumes_in_other_layouts(tmp_path, target):
    uninterrupted = train_dense(STEPS)
    first = save_after(tmp_path, (4, 1, 1, 3), STEPS // 2)  # parameters, gradients and moments sharded
    second, meta = resume(tmp_path, target, STEPS)
    assert meta["resharded"]
    assert_close(first + second, uninterrupted)


@pytest.mark.parametrize("target", [(2, 2, 1, 0), (2, 1, 2, 2)], ids=["dp2-tp2", "dp2-pp2-zero2"])
def test_a_zero_3_checkpoint_with_bf16_moments_resumes_in_other_layouts(tmp_path, target):
    """The bfloat16 moments saved as such (their bits) reshard like any: the run continues as one
    device keeping bfloat16 moments, which differs from float64 moments' run."""
    bf16 = precision_policy("fp64", moment_dtype="bfloat16")
    uninterrupted = train_dense(STEPS, moment_dtype="bfloat16")
    first = save_after(tmp_path, (4, 1, 1, 3), STEPS // 2, precision=bf16)
    second, meta = resume(tmp_path, target, STEPS, precision=bf16)
    assert meta["resharded"] and meta["manifest"]["optimizer"]["moment_dtype"] == "bfloat16"
    assert_close(first + second, uninterrupted)
    assert max(abs(a - b) for a, b in zip(uninterrupted, train_dense(STEPS))) > 1e-9


def test_zero_2_and_3_resume_in_the_same_layout_bitwise(tmp_path):
    for stage in (2, 3):
        layout = (2, 1, 2, stage)
        uninterrupted = straight(layout, STEPS, DROPOUT)
        first = save_after(tmp_path / str(stage), layout, STEPS // 2, DROPOUT)
        second, meta = resume(tmp_path / str(stage), layout, STEPS, DROPOUT)
        assert not meta["resharded"] and first + second == uninterrupted


# --- the manifest ---------------------------------------------------------------------

def test_manifest_records_config_layout_checksums_and_pieces(tmp_path):
    save_after(tmp_path, (2, 2, 1, True), 1)
    step_dir, manifest = open_manifest(tmp_path)
    assert step_dir.name == "step_000001" and (tmp_path / "latest").read_text().strip() == "step_000001"
    assert manifest["config"]["n_head"] == CONFIG.n_head and manifest["step"] == 1
    assert manifest["mesh"] == {"dp": 2, "tp": 2, "pp": 1, "cp": 1} and manifest["layout"]["zero"] == 1  # the ZeRO stage
    assert manifest["optimizer"]["type"] == "ZeroOptimizer" and manifest["optimizer"]["defaults"]["lr"] == 1e-2
    for name, facts in manifest["files"].items():
        data = (step_dir / name).read_bytes()
        assert facts["bytes"] == len(data) and facts["sha256"] == hashlib.sha256(data).hexdigest()
    q = manifest["tensors"]["blocks.0.attn.q.weight"]
    assert q["tp_axis"] == 0 and q["full_shape"] == [16, 16] and q["step"] == 1
    assert sorted((p["dp"], p["tp"]) for p in q["pieces"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(p["shape"] == [8, 16] for p in q["pieces"])
    ranges = sorted(tuple(p["moments"]) for p in manifest["tensors"]["tok_emb.weight"]["pieces"] if "moments" in p)
    assert ranges and all(hi > lo for lo, hi in ranges)  # ZeRO: flat ranges of the local array


# --- errors: clear, on every rank, nothing changed ---------------------------------------

def tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def errors_on_every_rank(directory, layout, config=CONFIG):
    """Each rank's CheckpointError message from loading, and whether its parameters stayed put."""
    def body():
        model = hybrid(*layout, config=config)
        before = [p.data.copy() for p in model.parameters()]
        try:
            load_checkpoint(directory, model)
        except CheckpointError as error:
            unchanged = all(np.array_equal(a, p.data) for a, p in zip(before, model.parameters()))
            return str(error), unchanged
        return None, None
    return threads(layout, body)


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.unlink(), "is missing"),
    (corrupt, "fails its SHA-256 checksum"),
    (lambda p: p.write_bytes(p.read_bytes()[:-10]), "size"),
])
def test_a_missing_or_corrupt_shard_fails_on_every_rank_naming_it(tmp_path, damage, message):
    save_after(tmp_path, (2, 1, 1), 1)
    shard = tmp_path / "step_000001" / "rank_00001.npz"
    damage(shard)
    before = tree(tmp_path)
    for layout in [(2, 1, 1), (1, 2, 1)]:  # the second reads only dp rank 0's file, yet checks them all
        for text, unchanged in errors_on_every_rank(tmp_path, layout):
            assert text is not None and "rank_00001.npz" in text and message in text and unchanged
        assert tree(tmp_path) == before


def test_a_checkpoint_of_another_model_is_refused_naming_the_field(tmp_path):
    save_after(tmp_path, (1, 2, 1), 1)
    before = tree(tmp_path)
    other = GPTConfig(**{**CONFIG.__dict__, "n_layer": 2})
    for text, unchanged in errors_on_every_rank(tmp_path, (1, 2, 1), other):
        assert "another model" in text and "n_layer: checkpoint 4, model 2" in text and unchanged
    assert tree(tmp_path) == before


def test_a_layout_the_model_cannot_take_is_refused_naming_the_values(tmp_path):
    save_after(tmp_path, (1, 2, 1), 1)
    _, manifest = open_manifest(tmp_path)
    with pytest.raises(CheckpointError, match="n_head=4 is not divisible by tp=3"):
        check_layout(manifest["config"], tp=3)
    with pytest.raises(CheckpointError, match="pp=4 x chunks=2 stages: n_layer=4"):
        check_layout(manifest["config"], pp=4, chunks=2)
    check_layout(manifest["config"], tp=4, pp=2, chunks=2)


def test_no_checkpoint_and_a_dangling_latest_are_named(tmp_path):
    model = hybrid()
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path, model)
    (tmp_path / "latest").write_text("step_000007\n")
    with pytest.raises(CheckpointError, match="names step_000007"):
        load_checkpoint(tmp_path, model)


# --- pruning (a failed save, pruning below another run: test_checkpoint_safety.py) -----------

class CrashingFileSystem:
    """Stands in for the `os` and `shutil` modules and the `open` that checkpoint/files.py
    uses: every file-system step (open, fsync, rename, replace, rmtree) is counted, and the
    one numbered `crash_at` raises instead of happening, as if the machine died there."""

    STEPS = ("open", "fsync", "rename", "replace", "rmtree")

    def __init__(self, crash_at=None):
        self.crash_at, self.steps = crash_at, []

    def __getattr__(self, name):
        real = getattr(os if hasattr(os, name) else shutil, name)
        if name not in self.STEPS:
            return real
        return lambda *args, **kw: self.step(name, real, *args, **kw)

    def step(self, name, real, *args, **kw):
        if len(self.steps) == self.crash_at:
            raise OSError(f"crash before {name} (injected)")
        self.steps.append(name)
        return real(*args, **kw)

    def install(self, monkeypatch):
        from parallel.checkpoint import files
        monkeypatch.setattr(files, "os", self)
        monkeypatch.setattr(files, "shutil", self)
        monkeypatch.setattr(files, "open", lambda *a, **kw: self.step("open", open, *a, **kw), raising=False)


def test_a_crash_at_any_step_of_the_commit_leaves_latest_at_a_complete_checkpoint(tmp_path, monkeypatch):
    # Every step of a save (shard, manifest, rename, latest, prune) is crashed in turn; with
    # keep=1 the save of step 2 also deletes step 1. Whatever the crash point, `latest` names
    # a complete checkpoint that loads, and step 1 is gone only once `latest` names step 2.
    model = hybrid()
    first = tmp_path / "first"
    save_checkpoint(first, model, step=1)
    normal = CrashingFileSystem()
    with monkeypatch.context() as patch:
        normal.install(patch)
        shutil.copytree(first, tmp_path / "count")
        save_checkpoint(tmp_path / "count", model, step=2, keep=1)
    assert {"open", "fsync", "rename", "replace", "rmtree"} <= set(normal.steps)
    for crash_at in range(len(normal.steps)):
        directory = tmp_path / f"crash_{crash_at}"
        shutil.copytree(first, directory)
        crashing = CrashingFileSystem(crash_at)
        with monkeypatch.context() as patch:
            crashing.install(patch)
            with pytest.raises(OSError, match="injected"):
                save_checkpoint(directory, model, step=2, keep=1)
        where = f"crash before step {crash_at} ({normal.steps[crash_at]}) of {normal.steps}"
        latest = (directory / "latest").read_text().strip()
        assert latest in ("step_000001", "step_000002"), where
        assert (directory / latest / "manifest.json").is_file(), where
        assert load_checkpoint(directory, model)["step"] == int(latest[-1]), where
    assert (tmp_path / "count" / "latest").read_text().strip() == "step_000002"
    assert sorted(p.name for p in (tmp_path / "count").iterdir()) == ["latest", "step_000002"]


def test_the_newest_k_checkpoints_are_kept_and_a_step_is_never_overwritten(tmp_path):
    def body():
        model = hybrid()
        for step in range(1, 5):
            train(model, [step - 1])
            save_checkpoint(tmp_path, model, step=step, keep=2)
        with pytest.raises(CheckpointError, match="step_000004 already exists"):
            save_checkpoint(tmp_path, model, step=4)
    body()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000003", "step_000004"]


# --- real processes --------------------------------------------------------------------------

def worker(args, **popen):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **popen)


def losses_of(stdout):
    return [float.fromhex(json.loads(line)["loss"]) for line in stdout.splitlines() if line.startswith("{")]


def test_a_killed_process_resumes_bitwise_in_a_fresh_one(tmp_path):
    straight_run = worker([tmp_path / "unused", "1,1,1", "--steps", STEPS])
    killed = worker([tmp_path, "1,1,1", "--steps", STEPS, "--save-at", 2, "--hang-after-save"])
    lines = []
    for line in killed.stdout:  # read until the checkpoint is published, then kill -9
        lines.append(line)
        if line.startswith("saved"):
            break
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    resumed = worker([tmp_path, "1,1,1", "--steps", STEPS, "--resume"])
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err
    reference, _ = straight_run.communicate(timeout=60)
    assert losses_of("".join(lines)) + losses_of(out) == losses_of(reference)


@requires_mpiexec
def test_save_under_mpiexec_4_resume_under_mpiexec_2_in_another_layout(tmp_path):
    saved = run_mpi(4, [WORKER, tmp_path, "2,2,1", "--zero", "--steps", 2, "--save-at", 2], timeout=60)
    resumed = run_mpi(2, [WORKER, tmp_path, "1,1,2", "--steps", STEPS, "--resume"], timeout=60)
    assert_close(losses_of(saved.stdout) + losses_of(resumed.stdout), train_dense(STEPS))


def test_a_config_field_added_since_the_checkpoint_was_saved_counts_as_its_default():
    """A dense GPT's checkpoint saved before GPTConfig gained the MoE fields loads into a dense
    GPT of now; one that differs in a field it does name is still refused."""
    from minitensor.models.gpt import GPTConfig
    from parallel.checkpoint.files import CheckpointError
    from parallel.checkpoint.manifest import check_config
    config = GPTConfig(vocab_size=14, block_size=8, n_layer=2, n_head=2, d_model=16)
    before = {k: v for k, v in dataclasses.asdict(config).items()
              if k not in ("n_experts", "top_k", "moe_every", "capacity_factor", "aux_loss_coef", "z_loss_coef",
                           "renormalize")}
    check_config({"config": before}, config, "old")
    with pytest.raises(CheckpointError, match="n_experts: checkpoint 0, model 4"):
        check_config({"config": before}, dataclasses.replace(config, n_experts=4), "old")


@pytest.mark.parametrize("source, target", [({}, {"balance": [1, 3]}), ({"balance": [3, 1]}, {}),
                                            ({}, {"schedule": "dualpipev", "chunks": 2, "microbatches": 4}),
                                            ({}, {"schedule": "dualpipe", "chunks": 2, "microbatches": 4}),
                                            ({"schedule": "dualpipe", "chunks": 2, "microbatches": 4},
                                             {"schedule": "dualpipe", "chunks": 2, "microbatches": 4, "balance": [3, 1]})],
                         ids=["even-to-uneven", "uneven-to-even", "line-to-v", "line-to-two-ways", "two-ways-uneven"])
def test_a_checkpoint_reshards_between_even_and_uneven_stages(tmp_path, source, target):
    uninterrupted = train_dense(STEPS)
    first = save_after(tmp_path, (1, 1, 2, False), STEPS // 2, **source)
    second, meta = resume(tmp_path, (1, 1, 2, False), STEPS, **target)
    assert_close(first + second, uninterrupted)
