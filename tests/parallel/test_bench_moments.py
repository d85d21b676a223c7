"""`python -m parallel.bench moments`: both moment dtypes timed, bfloat16's moments holding half the bytes."""
import re

from parallel.bench import moments


def test_a_short_moments_bench_times_both_and_bf16_holds_4_bytes_per_parameter(capsys):
    assert moments.main(["--params", "1000", "--steps", "2", "--warmup", "0"]) == 0
    held = re.findall(r"(\w+) +moments: .* moments hold ([\d,]+) bytes \((\d+) per parameter\)", capsys.readouterr().out)
    assert held == [("float32", "8,000", "8"), ("bfloat16", "4,000", "4")]
