"""`python -m parallel.bench moe`: every variant's all-to-all counted bytes equal the formula, and
the table has the dense model, top-1 with and without the balancing loss, and DeepSeek's routing
balanced by the loss (per sequence and per batch), loss-free, and device-limited, each with its MaxVio."""
import re

from parallel.bench import moe


def test_a_short_moe_bench_counts_the_formula_for_every_variant(capsys):
    assert moe.main(["--steps", "12", "--experts", "4", "--ep", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [line[:24].strip() for line in out[2:]]
    assert names == ["dense", "top-1 α=0", "top-1 α=0.01", "fine top-2 α=0.01", "fine top-2 α=0.01 batch",
                     "fine top-2 γ=0.01", "fine top-2 γ=0.01 M=1"]
    assert out[2].split()[-2:] == ["-", "-"] and all(line.endswith("(equal)") for line in out[3:])
    violations = [float(re.search(r"(\d+\.\d\d) {3}[\d,]+ \|", line).group(1)) for line in out[3:]]
    assert len(violations) == 6 and all(0 <= v <= 7 for v in violations)  # MaxVio lies in [0, E − 1]
