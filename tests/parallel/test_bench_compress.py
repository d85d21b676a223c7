"""python -m parallel.bench compress: its flags, and one tiny run under mpiexec whose counted
bytes and modelled seconds per step are the formulas."""
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
def test_a_tiny_run_reports_the_formulas(capsys):
    bench.main(["--dp", "2", "--links", "10gbe", "--methods", "topk:0.5", "--seeds", "0", "--max-steps", "2",
                "--eval-every", "2"])
    out = capsys.readouterr().out
    row = re.search(r"^ 2 10gbe +topk:0.5 +([\d,]+) +([0-9.]+) ", out, re.M)
    assert row, out
    k = math.ceil(0.5 * PARAMS)
    values, indices, loss = 2 * k * 4, 2 * k * 8, 8  # gathered bytes of values and indices; the loss's all-reduce
    assert int(row.group(1).replace(",", "")) == (values + indices) // 2 + loss
    link = parse_link("10gbe")
    modelled = link.seconds("all_gather", 2, values) + link.seconds("all_gather", 2, indices) + \
        link.seconds("all_reduce", 2, loss)
    assert float(row.group(2)) == pytest.approx(modelled, abs=1e-4)
