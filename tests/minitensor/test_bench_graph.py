"""`python -m minitensor.bench --graph` on a tiny GPT: the printed before → after rows are
the graphs' totals, the rewrites it names happened, and the loss is unchanged."""
import numpy as np

from minitensor import bench, bench_timing
from minitensor.bench_graph import graph_step
from minitensor.models.gpt import GPTConfig

TINY = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, d_model=16), 4  # 64 tokens > 3·16: qkv fuses


def test_graph_mode_prints_the_totals_before_and_after_the_passes(capsys, monkeypatch):
    monkeypatch.setitem(bench_timing.CONFIGS, "small", TINY)
    bench.main(["--graph", "--steps", "1", "--warmup", "0", "--release-memory", "--configs", "small"])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line[:20].strip(): line[20:].split() for line in lines[2:6]}
    totals = [graph_step(*TINY, rewrite=r)[1].graph.totals() for r in (False, True)]
    for label, key in (("nodes", "nodes"), ("FLOPs", "flops"), ("bytes moved", "bytes_moved"),
                       ("saved bytes", "saved_bytes")):
        assert rows[label][:2] == [f"{totals[0][key]:,}", f"{totals[1][key]:,}"], label
    assert totals[1]["bytes_moved"] < totals[0]["bytes_moved"] and totals[1]["flops"] == totals[0]["flops"]
    assert lines[6] == ("ops changed: BiasGelu 0 → 1, Concat 0 → 2, Gelu 1 → 0, GetItem 0 → 3, Linear 7 → 5, "
                        "Permute 5 → 4")
    before, after = (float(lines[7].split()[i]) for i in (2, 4))
    assert np.isclose(before, after, rtol=1e-5)
    assert lines[8].startswith("step time (median of 1") and "ratio" in lines[8]
