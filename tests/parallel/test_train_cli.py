"""`python -m parallel.train` on the threads backend: flags, --check, same losses for every
layout, reports, errors, trace, char-level text, resume."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import parallel.train.loop as loop
from minitensor import dtypes
from minitensor.data import recommended_config
from minitensor.models import BERT, BertConfig
from parallel.launch import BLAS_THREAD_VARS
from parallel.plan import param_count
from parallel.train import build_parser, main
from parallel.train.cli import fill_defaults

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1"]


def flags(*extra, steps=2):
    return TINY + ["--steps", str(steps), *extra]


def test_every_flag_has_a_one_line_help():
    parser = build_parser()
    for action in parser._actions:
        assert action.help and "\n" not in action.help, action.option_strings
    names = {s for a in parser._actions for s in a.option_strings}
    for flag in ("--n-layer", "--n-head", "--d-model", "--block-size", "--batch", "--steps", "--lr", "--dtype",
                 "--seed", "--dp", "--tp", "--pp", "--microbatches", "--schedule", "--chunks",
                 "--sequence-parallel", "--recompute-activations", "--zero", "--data", "--trace", "--check",
                 "--save", "--save-every", "--resume", "--eval-every", "--log-every", "--threads"):
        assert flag in names


def test_the_defaults_are_the_addition_task_recommended_config():
    args = fill_defaults(build_parser().parse_args([]))
    rec = recommended_config()
    assert (args.n_layer, args.n_head, args.d_model, args.batch, args.steps, args.lr, args.seed) == (
        rec["n_layer"], rec["n_head"], rec["d_model"], rec["batch_size"], rec["steps"], rec["lr"], rec["seed"])
    assert args.dtype == "float32" and args.block_size == 3 * rec["digits"] + 2
    assert (args.dp, args.tp, args.pp, args.microbatches) == (1, 1, 1, 1)


def test_the_learning_rate_warms_up_then_decays_on_a_cosine_to_zero():
    args = fill_defaults(build_parser().parse_args(["--lr", "0.08", "--steps", "8", "--warmup", "2"]))
    lr = [loop.learning_rate(args, step) for step in range(1, 9)]
    # lr · min(1, step/2) · (1 + cos(π·step/8)) / 2, by hand: cos(π/8) = 0.9238795, cos(π/4) = √2/2, ...
    expected = [0.08 * 0.5 * (1 + 0.9238795325112867) / 2, 0.08 * (1 + math.sqrt(0.5)) / 2,
                0.08 * (1 + 0.3826834323650898) / 2, 0.04, 0.08 * (1 - 0.3826834323650898) / 2,
                0.08 * (1 - math.sqrt(0.5)) / 2, 0.08 * (1 - 0.9238795325112867) / 2, 0.0]
    np.testing.assert_allclose(lr, expected, rtol=1e-12, atol=1e-17)
    no_warmup = fill_defaults(build_parser().parse_args(["--lr", "0.08", "--steps", "8", "--warmup", "0"]))
    assert loop.learning_rate(no_warmup, 1) == pytest.approx(0.08 * (1 + 0.9238795325112867) / 2, rel=1e-12)


def test_check_on_eight_threads_prints_the_report_and_passes(capsys, tmp_path):
    trace = tmp_path / "trace.json"
    result = main(flags("--threads", "8", "--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "2",
                        "--check", "--trace", str(trace)))
    out = capsys.readouterr().out
    assert result["check"] <= 1e-9
    assert "threads backend" in out and "mesh dp=2 x tp=2 x pp=2 over 8 ranks" in out
    assert re.search(r"^parameters per rank: 0: [\d,]+, 1: .*7: [\d,]+  \(single device: [\d,]+\)$", out, re.M)
    assert len(re.findall(r"^check step [12]: .* largest relative gradient difference \S+ \(\S+\) vs one device$",
                          out, re.M)) == 2
    assert re.search(r"^step 2/2  loss \d\.\d{4}  [\d,]+ tokens/s  elapsed \d+:\d\d  eta 0:00$", out, re.M)
    assert re.search(r"^held-out exact match: \d\.\d{4} \(\d+\.\d%\)$", out, re.M)
    assert re.search(r"^sample:\n\d+ \+ \d+ = ", out, re.M)
    assert re.search(r"^  tp all_reduce +\d+ calls +\d+\.\d{3} MB \| +\d+\.\d{3} MB$", out, re.M)
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == set(range(8))


def test_bert_on_eight_threads_passes_the_check_and_sums_its_tied_embedding(capsys):
    result = main(flags("--model", "bert", "--threads", "8", "--dp", "2", "--tp", "2", "--pp", "2",
                        "--microbatches", "2", "--check"))
    out = capsys.readouterr().out
    assert result["check"] <= 1e-9 and 0 <= result["metric"] <= 1
    assert "masked digits (MLM); BERT n_layer=2" in out
    config = BertConfig(vocab_size=13, block_size=9, n_layer=2, n_head=4, d_model=16, sep_id=11)
    assert number_in(r"single device: ([\d,]+)", out) == BERT(config).num_parameters() == param_count(config)
    assert re.search(r"^held-out masked-digit accuracy: \d\.\d{4}$", out, re.M)
    assert re.search(r"^sample:\n\d\d\+\d\d=_\d\d -> \d", out, re.M)  # the first sum digit masked
    # The tied embedding's copies: one all-reduce per step of the (padded 14/2 = 7, 16) shard, in float64.
    assert re.search(rf"^  embedding all_reduce +1 calls +{7 * 16 * 8 / 1e6:.3f} MB", out, re.M)


def number_in(pattern, text):
    return int(re.search(pattern, text).group(1).replace(",", ""))


def test_the_communication_table_leaves_out_groups_of_one_rank(capsys):
    main(flags("--threads", "2", "--dp", "2"))
    out = capsys.readouterr().out
    assert re.search(r"^  dp all_reduce +\d+ calls", out, re.M)
    assert not re.search(r"^  (tp|pp) ", out, re.M)  # tp = pp = 1: nothing moved there


def test_check_reports_the_dtype_it_needs():
    with pytest.raises(SystemExit) as exit_info:
        main(flags("--check", "--dtype", "float32"))
    assert exit_info.value.code == 2


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-9), ("float32", 2e-5)])
def test_the_same_seed_gives_the_same_losses_on_every_layout(dtype, rtol):
    layouts = [[], ["--threads", "8", "--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "2", "--zero"],
               ["--threads", "4", "--tp", "2", "--pp", "2", "--chunks", "2", "--schedule", "interleaved",
                "--microbatches", "2", "--sequence-parallel"],
               ["--threads", "2", "--pp", "2", "--microbatches", "4", "--schedule", "zb-h1"]]
    runs = [main(flags("--dtype", dtype, "--seed", "7", "--n-layer", "4", *layout, steps=3))["losses"]
            for layout in layouts]
    for losses in runs[1:]:
        np.testing.assert_allclose(losses, runs[0], rtol=rtol)


@pytest.mark.parametrize("extra, message", [
    (["--threads", "4", "--dp", "3"], "--dp 3 x --tp 1 x --pp 1 = 3 ranks, but the world has 4"),
    (["--threads", "2", "--tp", "2", "--n-head", "3", "--d-model", "12"], "--n-head 3 is not divisible by --tp 2"),
    (["--threads", "2", "--dp", "2", "--microbatches", "3"], "--batch 8 is not divisible by --dp 2 x --microbatches 3"),
    (["--threads", "2", "--tp", "2", "--sequence-parallel", "--digits", "3"],
     "sequence length 11 divisible by --tp 2"),
    (["--chunks", "2"], "--chunks 2 needs --schedule interleaved"),
    (["--sequence-parallel"], "--sequence-parallel shards by sequence what the tp ranks would each repeat, but --tp is 1"),
    (["--digits", "12"], "AdditionTask: digits must be in [1, 9], got 12"),
    (["--data", "/no/such/file.txt"], "--data /no/such/file.txt: No such file or directory"),
    (["--model", "bert", "--data", "x.txt"], "--model bert trains on the masked addition task"),
    (["--model", "bert", "--threads", "2", "--cp", "2"], "--cp 2 with --model bert: a BERT's segment"),
])
def test_bad_flags_are_clear_errors(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(flags(*extra))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_exception_on_one_rank_ends_the_threads_job(monkeypatch):
    def fail(model, task):  # rank 0 evaluates while the other ranks wait in the next collective
        raise RuntimeError("evaluation failed on rank 0")

    monkeypatch.setattr(loop, "evaluate", fail)
    with pytest.raises(RuntimeError, match="evaluation failed on rank 0"):
        main(flags("--threads", "4", "--dp", "2", "--pp", "2"))


def test_char_level_text_from_a_file(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 20)
    common = ["--data", str(text), "--block-size", "8", "--batch", "4", "--steps", "2", "--d-model", "16",
              "--n-head", "2", "--dtype", "float64"]
    result = main(common + ["--threads", "2", "--pp", "2"])
    out = capsys.readouterr().out
    assert "task: char-level text" in out and "vocab=" in out
    assert f"loss on 8 fixed batches: {result['metric']:.4f}\n" in out
    # The held-out loss of the gathered pipeline model is the single-device run's.
    one_device = main(common)
    np.testing.assert_allclose(result["losses"], one_device["losses"], rtol=1e-9)
    np.testing.assert_allclose(result["metric"], one_device["metric"], rtol=1e-9)
    assert result["losses"][1] != result["losses"][0]  # it trained


@pytest.mark.parametrize("model, saved_in", [("gpt", []), ("bert", ["--threads", "2", "--pp", "2", "--microbatches", "2"])])
def test_resume_in_another_layout_continues_the_same_losses(tmp_path, model, saved_in):
    # bert: saved with its tied embedding on both ends of a pipeline, resumed with it vocab-parallel
    whole = main(flags("--model", model, "--dtype", "float64", "--save", str(tmp_path), "--save-every", "2",
                       *saved_in, steps=4))["losses"]
    (after_two,) = tmp_path.glob("step_*2")  # the checkpoint after step 2 (the one after step 4 is newer)
    resumed = main(flags("--model", model, "--dtype", "float64", "--resume", str(after_two), "--threads", "4",
                         "--tp", "2", "--pp", "2", steps=4))["losses"]
    np.testing.assert_allclose(resumed, whole[2:], rtol=1e-9)


def test_python_dash_m_runs_the_job_with_one_blas_thread_and_help_works():
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARS}
    run = lambda *args: subprocess.run([sys.executable, "-m", "parallel.train", *args], capture_output=True,
                                       text=True, check=True, timeout=60, env=env).stdout
    assert "--microbatches" in run("--help") and "mpiexec -n 8 python -m mpi4py -m parallel.train" in run("--help")
    out = run(*flags(steps=1))
    assert "BLAS threads: 1 per process (parallel.train restarted itself with OPENBLAS_NUM_THREADS=1" in out
    assert "held-out exact match" in out


@pytest.mark.parametrize("extra, stage", [(["--zero"], 1), (["--zero", "2"], 2), (["--zero", "3"], 3), ([], 0)])
def test_zero_takes_a_stage_and_plain_zero_means_one(extra, stage):
    assert build_parser().parse_args(extra).zero == stage


def test_zero_3_with_tensor_and_pipeline_parallelism_passes_the_check(capsys):
    result = main(flags("--threads", "8", "--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "2",
                        "--zero", "3", "--check"))
    out = capsys.readouterr().out
    assert result["check"] <= 1e-9 and "ZeRO-3" in out
    assert re.search(r"^  dp all_gather +\d+ calls", out, re.M) and re.search(r"^  dp reduce_scatter", out, re.M)


@pytest.mark.parametrize("precision, stage, tolerance", [
    ("fp16", "2", 1e-2), pytest.param("bf16", "3", 8e-2, marks=pytest.mark.skipif(
        dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: this bfloat16 test did NOT run !!!"))])
def test_zero_2_and_3_under_a_16_bit_policy_pass_the_check(precision, stage, tolerance, capsys):
    result = main(flags("--threads", "2", "--dp", "2", "--zero", stage, "--precision", precision, "--check"))
    out = capsys.readouterr().out
    assert 0 < result["check"] <= tolerance and f"ZeRO-{stage}" in out and f"precision {precision}" in out
    # the gathers move 16-bit parameters, the reduce-scatter float32 gradients: stage 3 gathers
    # twice per step, so as many bytes as it reduce-scatters; stage 2 once, so half of them
    gathered = float(re.search(r"^  dp all_gather +\d+ calls +(\S+) MB", out, re.M).group(1))
    scattered = float(re.search(r"^  dp reduce_scatter +\d+ calls +(\S+) MB", out, re.M).group(1))
    assert gathered == pytest.approx(scattered * (1 if stage == "3" else 0.5), rel=0.01)


def test_a_zero_stage_out_of_range_is_a_flag_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(flags("--zero", "4"))
    assert exit_info.value.code == 2 and "--zero: invalid choice: 4" in capsys.readouterr().err
