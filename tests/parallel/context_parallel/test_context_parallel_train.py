"""`python -m parallel.train --cp N` on the threads backend: --check passes, the start-up summary
draws the 4D grid, the ring's traffic appears in the report, and bad cp flags are clear errors."""
import re

import pytest

from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1",
        "--steps", "2"]


def test_ulysses_passes_the_check(capsys):
    result = main(TINY + ["--threads", "4", "--cp", "2", "--tp", "2", "--cp-comm-type", "a2a", "--check"])
    assert result["check"] <= 1e-9
    assert "layout: dp=1 tp=2 pp=1 cp=2 (zigzag, Ulysses all-to-all)" in capsys.readouterr().out


def test_cp_with_tp_and_dp_passes_the_check_and_reports_the_4d_grid(capsys):
    result = main(TINY + ["--threads", "8", "--cp", "2", "--tp", "2", "--dp", "2", "--check"])
    out = capsys.readouterr().out
    assert result["check"] <= 1e-9
    assert "layout: dp=2 tp=2 pp=1 cp=2 (zigzag, ring attention)" in out
    assert "mesh dp=2 x tp=2 x pp=1 x cp=2 over 8 ranks (tp fastest, then cp, then dp, then pp)" in out
    assert "      cp0.tp0 cp0.tp1 cp1.tp0 cp1.tp1\n  dp0       0       1       2       3\n" in out
    for row in ("cp send", "cp recv", "dp_cp all_reduce", "tp all_reduce"):
        assert re.search(rf"^  {row} +\d+ calls", out, re.M), row


@pytest.mark.parametrize("extra, message", [
    (["--threads", "4", "--cp", "2"], "--dp 1 x --tp 1 x --pp 1 x --cp 2 = 2 ranks, but the world has 4"),
    (["--threads", "2", "--cp", "2", "--digits", "3"],
     "--cp 2 --cp-layout zigzag: context parallelism: sequence length 11 is not divisible by 2·cp = 4"),
    (["--threads", "3", "--cp", "3", "--cp-layout", "contiguous"], "sequence length 8 is not divisible by cp = 3"),
    (["--threads", "4", "--cp", "2", "--tp", "2", "--digits", "4", "--cp-layout", "contiguous", "--sequence-parallel"],
     "--sequence-parallel with --cp 2 needs the sequence length 14 / cp = 7 divisible by --tp 2"),
    (["--threads", "4", "--cp", "4", "--cp-comm-type", "a2a", "--n-head", "2"],
     "--cp-comm-type a2a needs the heads per tp rank, --n-head 2 / --tp 1 = 2, divisible by --cp 4"),
    (["--cp", "0"], "--cp"),
])
def test_bad_cp_flags_are_clear_errors(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + extra)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
