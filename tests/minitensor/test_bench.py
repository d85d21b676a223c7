"""The benchmark program runs, and its matmul timer wraps only while measuring (the PyTorch comparison skipped)."""
import numpy as np

import minitensor as mt
from minitensor import bench
from minitensor.nn import functional as F
from minitensor.ops import MatMul


def test_matmul_timer_counts_linear_and_matmul_and_then_unwraps_them():
    originals = {(cls, n): cls.__dict__[n] for cls in (MatMul, F.Linear) for n in ("forward", "backward")}
    x = mt.tensor(np.ones((64, 64)), requires_grad=True)
    with bench.matmul_timer() as inside:
        F.linear(x @ x, x).sum().backward()
        assert all(cls.__dict__[n] is not fn for (cls, n), fn in originals.items())
    assert inside[0] > 0
    assert all(cls.__dict__[n] is fn for (cls, n), fn in originals.items())


def test_bench_prints_one_row_per_config_without_torch(capsys):
    bench.main(["--steps", "2", "--warmup", "0", "--no-torch", "--release-memory", "--configs", "small"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "BLAS threads" in lines[0] and "released to the OS" in lines[0]
    assert lines[1].split() == ["config", "ms/step", "tokens/s", "matmul", "torch", "ms", "ratio"]
    name, ms, tokens, share, torch_ms, ratio = lines[2].split()
    assert name == "small" and float(ms) > 0 and 0 < float(share.rstrip("%")) <= 100
    np.testing.assert_allclose(float(tokens), 16 * 64 / (float(ms) / 1e3), rtol=0.01)  # batch 16 x block 64
    assert (torch_ms, ratio) == ("-", "-")
