"""The benchmark program's arithmetic, on a fake clock that ticks 1 ms at every reading: its
matmul timer wraps only while measuring, counts exactly the wrapped calls, and the printed
row follows from the ticks (the PyTorch comparison skipped)."""
import itertools
import types

import numpy as np
import pytest

import minitensor as mt
from minitensor import bench
from minitensor.nn import functional as F
from minitensor.ops import MatMul

TICK = 1e-3


@pytest.fixture
def ticking_clock(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * TICK))


def test_matmul_timer_counts_linear_and_matmul_and_then_unwraps_them(ticking_clock):
    originals = {(cls, n): cls.__dict__[n] for cls in (MatMul, F.Linear) for n in ("forward", "backward")}
    x = mt.tensor(np.ones((64, 64)), requires_grad=True)
    with bench.matmul_timer() as inside:
        F.linear(x @ x, x).sum().backward()
        assert all(cls.__dict__[n] is not fn for (cls, n), fn in originals.items())
    # one tick inside each of MatMul.forward, Linear.forward, Linear.backward, MatMul.backward
    assert inside[0] == pytest.approx(4 * TICK, rel=1e-12)
    assert all(cls.__dict__[n] is fn for (cls, n), fn in originals.items())


def test_bench_prints_one_row_per_config_without_torch(capsys, ticking_clock):
    bench.main(["--steps", "2", "--warmup", "0", "--no-torch", "--release-memory", "--configs", "small"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "BLAS threads" in lines[0] and "released to the OS" in lines[0]
    assert lines[1].split() == ["config", "ms/step", "tokens/s", "matmul", "torch", "ms", "ratio"]
    name, ms, tokens, share, torch_ms, ratio = lines[2].split()
    # A step with n timed matrix products reads the clock 2n + 2 times: 2n + 1 ticks long, n inside.
    # The small GPT has 17 products: 2 blocks × (q, k, v, attn.proj, mlp.fc, mlp.proj Linears and
    # the 2 attention matmuls) + lm_head; each runs forward and backward: n = 34, 69 ticks, 34/69.
    assert name == "small" and ms == "69.0" and share == f"{34 / 69:.0%}"
    assert float(tokens) == pytest.approx(16 * 64 / (float(ms) / 1e3), abs=0.5)  # batch 16 x block 64
    assert (torch_ms, ratio) == ("-", "-")
