"""`python -m parallel.train --attention flash`: the tiled kernel under tp (heads), pp (stages) and
cp (ring attention's block pairs, Ulysses' heads), for the GPT and BERT, passes --check against the
dense one-device model, on threads and on real MPI ranks; its flags are checked before any work."""

import pytest
from mpi_launch import requires_mpiexec, run_mpi

from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1",
        "--steps", "2", "--attention", "flash"]


@pytest.mark.parametrize("layout", [
    ["--threads", "4", "--tp", "2", "--pp", "2", "--microbatches", "2", "--attention-block", "3"],
    ["--threads", "4", "--cp", "2", "--tp", "2", "--attention-block", "2"],
    ["--threads", "4", "--cp", "2", "--dp", "2", "--zero", "3", "--cp-layout", "contiguous"],
    ["--threads", "2", "--cp", "2", "--cp-comm-type", "a2a", "--attention-block", "5"],
    ["--threads", "4", "--model", "bert", "--tp", "2", "--pp", "2", "--attention-block", "4"],
], ids=["tp2-pp2", "cp2-tp2", "cp2-dp2-zero3", "ulysses-cp2", "bert-tp2-pp2"])
def test_flash_attention_passes_the_check_against_the_dense_single_device_model(layout, capsys):
    result = main(TINY + layout + ["--check"])
    assert result["check"] <= 1e-9
    assert "flash attention in" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--attention", "dense", "--attention-block", "8"], "--attention-block 8 sets flash attention's tiles; add "
                                                         "--attention flash"),
    (["--attention-block", "0"], "--attention-block=0 must be ≥ 1"),
    (["--threads", "3", "--dp", "2", "--async-staleness", "1"], "does not combine with --attention flash"),
])
def test_bad_attention_flags_are_one_line_errors(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@requires_mpiexec
@pytest.mark.parametrize("layout, line", [
    (["--tp", "2", "--cp", "2"], "layout: dp=1 tp=2 pp=1 cp=2 (zigzag, ring attention)"),
    (["--tp", "2", "--pp", "2", "--microbatches", "2"], "layout: dp=1 tp=2 pp=2"),
], ids=["tp2-cp2", "tp2-pp2"])
def test_flash_attention_on_real_mpi_ranks_passes_the_check(layout, line):
    out = run_mpi(4, ["-m", "parallel.train", *TINY, *layout, "--attention-block", "3", "--check"], timeout=300).stdout
    assert line in out and "flash attention in 3×3 tiles" in out
    worst = float(out.split("check: largest relative difference to one device over 2 step(s): ")[1].split()[0])
    assert worst <= 1e-9, out


