"""The benchmark program's arithmetic, on a fake clock that ticks 1 ms at every reading: its
matmul timer wraps only while measuring, counts exactly the wrapped calls, and the printed
row follows from the ticks (the PyTorch comparison skipped)."""
import contextlib
import itertools
import types

import numpy as np
import pytest

import minitensor as mt
from minitensor import bench, bench_numpy, bench_timing, graph
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F
from minitensor.ops import MatMul

TICK = 1e-3


@pytest.fixture
def ticking_clock(monkeypatch):
    ticks = itertools.count()
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks) * TICK)
    monkeypatch.setattr(bench_timing, "time", clock)  # one clock for the GEMM probe and the timed steps


def test_matmul_timer_counts_linear_and_matmul_and_then_unwraps_them(ticking_clock):
    originals = {(cls, n): cls.__dict__[n] for cls in (MatMul, F.Linear) for n in ("forward", "backward")}
    x = mt.tensor(np.ones((64, 64)), requires_grad=True)
    with bench_timing.matmul_timer() as inside:
        F.linear(x @ x, x).sum().backward()
        assert all(cls.__dict__[n] is not fn for (cls, n), fn in originals.items())
    # one tick inside each of MatMul.forward, Linear.forward, Linear.backward, MatMul.backward
    assert inside[0] == pytest.approx(4 * TICK, rel=1e-12)
    assert all(cls.__dict__[n] is fn for (cls, n), fn in originals.items())


def test_bench_prints_one_row_per_config_without_torch(capsys, ticking_clock):
    bench.main(["--steps", "2", "--warmup", "0", "--no-torch", "--release-memory", "--configs", "small"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "BLAS threads" in lines[0] and "released to the OS" in lines[0]
    # each GEMM probe reads the clock twice: 1 tick, so the rate is 2·1024³ FLOPs per ms
    rate = 2 * 1024**3 / TICK
    assert lines[1].startswith(f"GEMM rate: {rate / 1e9:.1f} GFLOP/s")
    assert lines[2].split() == ["config", "ms/step", "tokens/s", "matmul", "MFU", "peak", "MiB", "numpy", "ms",
                                "ratio", "spread", "torch", "ms", "ratio", "torch", "MFU", "torch", "MiB"]
    (name, ms, tokens, share, mfu, peak, numpy_ms, numpy_ratio, numpy_spread, torch_ms, ratio, torch_mfu,
     torch_mib) = lines[3].split()
    # A step with n timed matrix products reads the clock 2n + 2 times: 2n + 1 ticks long, n inside.
    # The small GPT has 17 products: 2 blocks × (q, k, v, attn.proj, mlp.fc, mlp.proj Linears and
    # the 2 attention matmuls) + lm_head; each runs forward and backward: n = 34, 69 ticks, 34/69.
    assert name == "small" and ms == "69.0" and share == f"{34 / 69:.0%}"
    assert float(tokens) == pytest.approx(16 * 64 / (float(ms) / 1e3), abs=0.5)  # batch 16 x block 64
    # N = 2 blocks × (12d² + 13d) + ln_f 2d + lm_head 64·d with d = 128 (embeddings left out);
    # tokens 16·64; attention 12·n_layer·d·T per token
    n, tokens_per_step = 2 * (12 * 128**2 + 13 * 128) + 2 * 128 + 64 * 128, 16 * 64
    flops = 6 * n * tokens_per_step + 12 * 2 * 128 * 64 * tokens_per_step
    assert mfu == f"{flops / 69e-3 / rate:.0%}"
    assert peak == "-" or int(peak) >= 0
    assert (torch_ms, ratio, torch_mfu, torch_mib) == ("-", "-", "-", "-")
    # the numpy limit's step reads the clock twice, one tick: 69 times faster than the engine's, in every pair
    assert (numpy_ms, numpy_ratio, numpy_spread) == ("1.0", "69.00x", "69.00-69.00")


def test_the_tiny_config_is_the_small_gpts_ops_and_runs_only_when_asked(capsys, ticking_clock):
    """`--configs tiny` times the small GPT's ops with almost no arithmetic (its fixed cost per
    step): the same 17 timed products, the same 52 graph nodes; the default runs small and medium."""
    assert bench_timing.DEFAULT_CONFIGS == ("small", "medium")
    (small, _), (tiny, _) = bench_timing.CONFIGS["small"], bench_timing.CONFIGS["tiny"]
    assert (tiny.n_layer, tiny.n_head) == (small.n_layer, small.n_head)
    sizes = [len(graph.trace(GPT(c).forward, *bench_timing.random_batch(c, 1)).graph.nodes) for c in (small, tiny)]
    assert sizes[0] == sizes[1]
    bench.main(["--steps", "2", "--warmup", "0", "--no-torch", "--configs", "tiny"])
    row = capsys.readouterr().out.strip().splitlines()[3].split()
    assert row[0] == "tiny" and row[1] == "69.0"  # 34 timed products, as the small GPT's: 2·34 + 1 ticks


def test_the_numpy_limit_is_the_same_step_loss_gradients_and_adamw():
    """From the same weights (float64), the hand-written step's loss and every gradient equal
    the engine's, and one AdamW step leaves the same weights."""
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=16)
    mt.manual_seed(0)
    model = GPT(config, dtype=np.float64)
    idx, targets = bench_timing.random_batch(config, 3)
    reference = bench_numpy.NumpyGPT(config, model.state_dict())
    loss, grads = reference.loss_and_grads(idx, targets)
    _, engine_loss = model(idx, targets)
    engine_loss.backward()
    assert loss == pytest.approx(engine_loss.item(), rel=1e-12)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad, rtol=1e-10, atol=1e-14, err_msg=name)
    step = bench_numpy.numpy_step(config, model.state_dict(), idx, targets)
    step()
    bench_timing.training_step(model, model, idx, targets)()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(step.model.params[name], p.data, rtol=1e-10, atol=1e-14, err_msg=name)


def test_peak_step_bytes_sees_an_array_the_step_touches():
    nbytes = 64 * 2**20
    peak = bench_timing.peak_step_bytes(lambda: np.ones(nbytes // 8))
    if peak is not None:  # Linux: the 64 MiB array was resident at the peak
        assert peak >= 0.9 * nbytes


def test_the_paired_ratio_divides_out_a_slow_round():
    """Round 2 runs both libraries twice as slow (the machine, not the code): that round's ratio
    is still 0.8, and the paired ratio is the median of 0.8, 0.8 and 0.9. The ratio of the
    overall medians (0.9 / 1.0) lets the slow round move the medians instead."""
    mine = [[0.8, 0.8], [1.6, 1.6], [0.9, 0.9]]
    theirs = [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]
    assert bench_timing.paired_ratio(mine, theirs) == pytest.approx(0.8)
    assert bench_timing.every_step(mine) == [0.8, 0.8, 1.6, 1.6, 0.9, 0.9]
    assert np.median(bench_timing.every_step(mine)) / np.median(bench_timing.every_step(theirs)) == pytest.approx(0.9)


def test_pair_ratios_compare_the_two_steps_of_each_pair():
    """The second pair ran with the machine twice as slow: its ratio is still 0.8. The partner's
    steps are listed pair by pair, whichever of the two ran first."""
    mine, theirs = [[0.8, 1.6], [0.9]], [[1.0, 2.0], [1.0]]
    assert bench_timing.pair_ratios(mine, theirs) == pytest.approx([0.8, 0.8, 0.9])


def test_time_steps_alternates_the_partner_step_by_step(monkeypatch):
    """The engine and its partner run in turn, each first in turn; torch runs in one block after them."""
    calls = []
    monkeypatch.setattr(bench_timing, "matmul_timer", lambda: contextlib.nullcontext([0.0]))
    times, _, partner, (other,), _ = bench_timing.time_steps(
        lambda: calls.append("e"), 4, 0, partner=lambda: calls.append("n"), others=[lambda: calls.append("t")],
        rounds=1)
    assert "".join(calls) == "enneennetttt"
    assert [len(r) for r in (times[0], partner[0], other[0])] == [4, 4, 4]


def test_the_attention_bench_prints_both_kernels_saved_bytes_and_runs_flash_past_the_budget(capsys, ticking_clock):
    """On the fake clock: a row per length with both kernels' saved bytes (the engine's count), and at
    --beyond the dense probabilities (4 heads × 1024² × 4 B = 16 MiB) over the 1 MiB budget: flash alone runs."""
    bench.main(["--attention", "--lengths", "64", "--steps", "4", "--warmup", "0", "--heads", "4", "--head-size", "8",
                "--block", "16", "--beyond", "1024", "--budget", "1"])
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["64"])
    dense_mib, flash_mib = float(row[-2]), float(row[-1])
    assert dense_mib == pytest.approx((4 * 64 * 64 + 3 * 4 * 64 * 8) * 4 / 2**20, abs=0.05)
    assert flash_mib == pytest.approx((4 * 4 * 64 * 8 + 4 * 64) * 4 / 2**20, abs=0.05)
    assert "at T = 1024 the dense kernel's probabilities alone take 16 MiB > the budget (not run)" in out
    assert "flash at T = 1024: saves 0.5 MiB (within the budget)" in out
