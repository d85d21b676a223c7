"""python -m parallel.bench compress: its flags, and one tiny run under mpiexec whose counted
bytes and modelled seconds per step are the formulas, and whose seconds to the target are
the steps times the link's step time."""
import json
import math
import re

import pytest
from mpi_launch import requires_mpiexec

import parallel.bench.compress as bench
from parallel.comm.link import parse_link

PARAMS = 400896  # the default model


def test_bad_flags_are_named(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--dp", "0"])
    assert "--dp=0 must be ≥ 1" in capsys.readouterr().err


@requires_mpiexec
def test_a_tiny_run_reports_the_formulas_and_keeps_its_runs(capsys, tmp_path):
    results = tmp_path / "runs.jsonl"
    argv = ["--dp", "2", "--links", "10gbe", "--methods", "topk:0.5", "--seeds", "0", "--max-steps", "8",
            "--eval-every", "2", "--target", "0", "--timing-steps", "2", "--results", str(results)]
    bench.main(argv)
    out = capsys.readouterr().out
    row = re.search(r"^ 2 10gbe +topk:0.5 +([\d,]+) +([0-9.]+) +([0-9.]+) +[0-9.]+ +(\d+) +([0-9.]+) ", out, re.M)
    assert row, out
    k = math.ceil(0.5 * PARAMS)
    values, indices, loss = 2 * k * 4, 2 * k * 8, 8  # gathered bytes of values and indices; the loss's all-reduce
    assert int(row.group(1).replace(",", "")) == (values + indices) // 2 + loss
    link = parse_link("10gbe")
    modelled = link.seconds("all_gather", 2, values) + link.seconds("all_gather", 2, indices) + \
        link.seconds("all_reduce", 2, loss)
    assert float(row.group(2)) == pytest.approx(modelled, abs=1e-4)
    step_s, steps, seconds = float(row.group(3)), int(row.group(4)), float(row.group(5))
    assert steps == 2 and seconds == pytest.approx(steps * step_s, abs=0.1)  # both printed rounded
    kinds = sorted(json.loads(line)["kind"] for line in results.read_text().splitlines())
    assert kinds == ["steps", "timing"]
    bench.main(argv)  # every run is in the file: nothing runs again, the same row is printed
    assert row.group(0) in capsys.readouterr().out and len(results.read_text().splitlines()) == 2
