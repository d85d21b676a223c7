"""The 3D model and the training job on 8 real MPI ranks (`mpiexec -n 8`, oversubscribed on a laptop)."""
import json
import re
from pathlib import Path

import pytest
from mpi_launch import requires_mpiexec, run_mpi

from minitensor import dtypes

SCRIPTS = Path(__file__).parents[1] / "mpi_scripts"
pytestmark = requires_mpiexec
TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "16", "--digits", "2"]


def test_six_layouts_of_eight_ranks_pass_the_single_device_check():
    # ~20 s on a quiet machine: the 300 s bound only catches a hang
    result = run_mpi(8, [SCRIPTS / "hybrid_train_layouts.py"], timeout=300)
    checks = re.findall(r"^layout (\d,\d,\d) check (\S+)$", result.stdout, re.MULTILINE)
    assert [layout for layout, _ in checks] == ["2,2,2", "1,2,4", "4,2,1", "2,4,1", "8,1,1", "1,1,8"]
    assert all(float(worst) <= 1e-9 for _, worst in checks)


def test_the_main_job_under_mpiexec_prints_its_report_and_writes_the_trace(tmp_path):
    trace = tmp_path / "trace.json"
    result = run_mpi(8, ["-m", "parallel.train", "--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "4",
                         "--schedule", "1f1b", "--steps", "3", "--log-every", "1", "--trace", trace, *TINY],
                     timeout=60)
    out = result.stdout
    assert "parallel: 8 rank(s) on the mpi backend; BLAS threads: as set by the user: OPENBLAS_NUM_THREADS=1" in out
    assert "mesh dp=2 x tp=2 x pp=2 over 8 ranks" in out and out.count("parameters per rank:") == 1
    assert len(re.findall(r"^step [123]/3  loss \d\.\d{4}  [\d,]+ tokens/s  elapsed \d+:\d\d  eta \d+:\d\d$",
                          out, re.MULTILINE)) == 3
    assert re.search(r"^held-out exact match: \d\.\d{4}", out, re.MULTILINE)
    for row in ("tp all_reduce", "dp all_reduce", "pp send", "pp recv"):
        assert re.search(rf"^  {row} +\d+ calls", out, re.MULTILINE), row
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == set(range(8))


def test_bert_under_mpiexec_passes_the_single_device_check():
    # 4 real ranks: tp=2 shards the vocabulary of the tied embedding, pp=2 puts its two uses on
    # different ranks (summed over the embedding group), and the masking is the same on every rank.
    result = run_mpi(4, ["-m", "parallel.train", "--model", "bert", "--tp", "2", "--pp", "2", "--microbatches", "2",
                         "--steps", "3", "--check", "3", *TINY], timeout=120)
    out = result.stdout
    worst = re.search(r"^check: largest relative difference to one device over 3 step\(s\): (\S+) ", out, re.M)
    assert worst and float(worst.group(1)) <= 1e-9
    assert re.search(r"^  embedding all_reduce +1 calls", out, re.M)
    assert re.search(r"^held-out masked-digit accuracy: \d\.\d{4}$", out, re.M)


def test_a_layout_that_does_not_fit_the_world_is_an_error_on_every_rank_printed_once():
    # a hang fails in run_mpi's timeout; every rank finds the error, rank 0 prints it and ends the job
    result = run_mpi(8, ["-m", "parallel.train", "--dp", "2", "--tp", "2", *TINY], timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.count("--dp 2 x --tp 2 x --pp 1 = 4 ranks, but the world has 8") == 1, result.stderr
    assert "rank 0: --dp 2 x --tp 2 x --pp 1 = 4 ranks, but the world has 8" in result.stderr


@pytest.mark.parametrize("precision, tolerance", [
    ("fp16", "0.01"), pytest.param("bf16", "0.08", marks=pytest.mark.skipif(
        dtypes.bfloat16 is None, reason="!!! ml_dtypes is NOT installed: the bfloat16 MPI test did NOT run !!!"))])
def test_16_bit_on_four_ranks_equals_one_device_under_the_same_policy(precision, tolerance):
    # 16-bit activations cross real MPI (float16: MPI's half sums; bfloat16: its bits as UINT16_T and a
    # user-defined bfloat16 sum) in the tp all-reduces; the masters' gradients are reduced in float32
    result = run_mpi(4, ["-m", "parallel.train", "--dp", "2", "--tp", "2", "--microbatches", "2", "--precision",
                         precision, "--check", "2", "--steps", "2", *TINY], timeout=120)
    worst = re.search(rf"^check: largest relative difference to one device over 2 step\(s\): (\S+) \(tolerance "
                      rf"{tolerance} under the same policy, {precision}\)$", result.stdout, re.MULTILINE)
    assert worst and float(worst.group(1)) <= float(tolerance), result.stdout
    if precision == "fp16":
        assert re.search(r"^loss scale: 65536 at the end; 0 step\(s\) skipped", result.stdout, re.MULTILINE)
