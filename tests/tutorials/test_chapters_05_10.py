"""Chapters 5-8 and 10: every script runs (threads, and mpiexec for at least one per
chapter) and prints the evidence its README talks about; the numbers are parsed and checked."""
import re

import pytest
from chapter_runner import mpi, number_after, numbers_after, run_script

EXACT = 1e-12   # float64 differences to one device are round-off (the contract is 1e-9 relative)

CH5 = "tutorials/05_tensor_parallel/column_row_mlp.py"
CH6 = "tutorials/06_attention_vocab_sp/"
CH7 = "tutorials/07_pipelines/gpipe.py"
CH8 = "tutorials/08_1f1b_recomputation/"
CH10 = "tutorials/10_planner/"


def collective(out, phase, pairing):
    """{kind: (calls, elements, bytes)} of one printed 'forward:'/'backward:' line of a pairing."""
    section = out.split(pairing, 1)[1]
    line = re.search(rf"{phase}:\s+(.*)", section).group(1)
    return {kind: tuple(int(v) for v in values) for kind, *values in
            re.findall(r"(\w+) (\d+) call\(s\) (\d+) elements (\d+) bytes", line)}


@pytest.mark.parametrize("how", [{"threads": 2}, {"threads": 4}, mpi(2)], ids=["threads2", "threads4", "mpi2"])
def test_ch5_mlp_equals_dense_with_one_all_reduce_each_way(how):
    out = run_script(CH5, **how)
    tp = int(number_after("tensor parallel size tp =", out))
    assert tp == how.get("threads", how.get("mpi_ranks"))
    for label in ("output:", "input gradient:", "weight gradients:"):
        assert number_after(label, out) <= EXACT
    # the picture: fc.weight rows split into tp equal blocks, proj.weight columns likewise
    fc_rows = re.findall(r"^    ((?:\d )+\d)$", out.split("fc.weight")[1].split("proj.weight")[0], re.M)
    assert [int(row[0]) for row in fc_rows] == [i * tp // len(fc_rows) for i in range(len(fc_rows))]
    proj_row = re.search(r"^    ((?:\d )+\d)$", out.split("proj.weight")[1], re.M).group(1).split()
    assert [int(r) for r in proj_row] == [i * tp // len(proj_row) for i in range(len(proj_row))]
    assert number_after("differs from the sum of gelus by:", out) > 0.01
    elements = int(number_after("activation 2x3x4 =", out))
    megatron_fwd, megatron_bwd = (collective(out, p, "Megatron pairing") for p in ("forward", "backward"))
    assert megatron_fwd == megatron_bwd == {"all_reduce": (1, elements, 2 * (tp - 1) * elements * 8 // tp)}
    naive_fwd, naive_bwd = (collective(out, p, "naive pairing") for p in ("forward", "backward"))
    assert naive_fwd["all_gather"][0] == 2 and naive_bwd["all_reduce"][0] == 2
    assert number_after("naive output difference vs one device:", out) <= EXACT


@pytest.mark.parametrize("how", [{"threads": 4}, mpi(2)], ids=["threads4", "mpi2"])
def test_ch6_attention_split_by_heads(how):
    out = run_script(CH6 + "attention_heads.py", **how)
    tp = how.get("threads", how.get("mpi_ranks"))
    for label in ("output:", "input gradient:", "weight gradients:"):
        assert number_after(label, out) <= EXACT
    assert "parameters compared by dense name: True" in out
    heads = [int(h) for h in out.split("head ")[1].split("\n")[0].split()]
    ranks = [int(r) for r in out.split("q,k,v rank")[1].split("\n")[0].split()]
    assert all(ranks[i] == ranks[j] for i in range(len(heads)) for j in range(len(heads)) if heads[i] == heads[j])
    assert number_after("local heads per rank =", out) == 4 // tp
    assert re.search(r"forward all_reduce 1 call\(s\) 80 elements; backward all_reduce 1 call\(s\) 80 elements", out)


def test_ch6_vocab_parallel_pads_and_sends_three_numbers_per_token():
    out = run_script(CH6 + "vocab_parallel.py", threads=4)
    assert "vocabulary 10 padded to 12 = 4 x 3 rows" in out
    for label in ("embedding output:", "embedding weight gradient:", "cross-entropy loss:",
                  "cross-entropy logit gradient:", "largest gradient on padding columns:"):
        assert number_after(label, out) <= EXACT
    assert number_after("18 elements =", out) == 3
    assert number_after("would move 72 elements =", out) == 12


@pytest.mark.parametrize("how", [{"threads": 2}, mpi(2)], ids=["threads2", "mpi2"])
def test_ch6_sequence_parallel_same_volume_less_memory_equal_gradients(how):
    out = run_script(CH6 + "sequence_parallel.py", **how)
    for label in ("output:", "input gradient:", "parameter gradients:"):
        assert all(d <= EXACT for d in numbers_after(label, out)) and len(numbers_after(label, out)) == 2
    bytes_sent = numbers_after("total bytes sent per rank:", out)
    assert bytes_sent[0] == bytes_sent[1] > 0
    assert number_after("bytes with SP / bytes without SP =", out) == 1.0
    assert "all_reduce 4 calls" in out and "all_gather 4 calls" in out and "reduce_scatter 4 calls" in out
    dense, tp, sp = (int(v) for v in re.findall(r"^  (?:one device|tp=\d(?: \+ sequence parallel)?)\s+(\d+)", out, re.M))
    assert dense > tp > sp
    assert number_after("loss difference", out) <= EXACT
    assert number_after("largest gradient difference", out) <= EXACT


def pipeline_rows(out):
    return [tuple(map(float, row)) for row in re.findall(
        r"m=(\d+)\s+loss diff=\s*(\S+)\s+grad diff=\s*(\S+)\s+bubble measured=\s*(\S+)\s+theory=\s*(\S+)", out)]


@pytest.mark.parametrize("how", [{"threads": 2}, mpi(2)], ids=["threads2", "mpi2"])
def test_ch7_gpipe_cut_schedule_bubble_and_trace(how, tmp_path):
    trace = tmp_path / "trace.json"
    out = run_script(CH7, "--trace", trace, **how)
    assert re.search(r"stage 0 on rank 0: embeddings, blocks \[0, 1\]", out)
    assert re.search(r"stage 1 on rank 1: blocks \[2, 3\], ln_f \+ lm_head \+ loss", out)
    assert number_after("simulated bubble:", out) == number_after("theory (p-1)/(m+p-1):", out) == 0.2
    rows = pipeline_rows(out)
    assert [r[0] for r in rows] == [1, 2, 4, 8]
    for m, loss_diff, grad_diff, measured, theory in rows:
        assert loss_diff <= EXACT and grad_diff <= EXACT
        assert theory == pytest.approx(1 / (m + 1), abs=1e-3)
    # m = 1: F0 on rank 0, F0 and B0 on rank 1, B0 on rank 0 each wait for the one before, so no two
    # computations overlap: busy time ≤ the makespan, idle ≥ half of 2 ranks × makespan, whatever the
    # timings. (For m > 1 the measured figure depends on the machine's load; the theory is checked.)
    assert rows[0][3] >= 0.5
    assert "rank 1 | " in out and trace.stat().st_size > 0


@pytest.mark.parametrize("how", [{"threads": 4}, mpi(2)], ids=["threads4", "mpi2"])
def test_ch8_1f1b_stores_at_most_p_micro_batches(how):
    out = run_script(CH8 + "one_f_one_b.py", **how)
    p = how.get("threads", how.get("mpi_ranks"))
    assert "gpipe simulated peak stored micro-batches per stage: [8, 8, 8, 8]" in out
    assert "1f1b simulated peak stored micro-batches per stage: [4, 3, 2, 1]" in out
    assert number_after("gpipe simulated bubble:", out) == number_after("1f1b simulated bubble:", out)
    assert f"gpipe peak stored micro-batches per stage: {[8] * p}" in out
    assert f"1f1b peak stored micro-batches per stage: {list(range(p, 0, -1))}" in out
    assert all(d <= EXACT for d in numbers_after("largest gradient difference", out))
    assert number_after("gpipe vs 1f1b gradients, largest difference:", out) == 0
    gpipe_bytes = [int(b) for b in re.findall(r"gpipe\s+stage \d\s+(\d+)", out)]
    one_bytes = [int(b) for b in re.findall(r"1f1b\s+stage \d\s+(\d+)", out)]
    assert len(gpipe_bytes) == len(one_bytes) == p and all(o < g for o, g in zip(one_bytes, gpipe_bytes))


def test_ch8_recomputation_trades_forwards_for_memory():
    out = run_script(CH8 + "recomputation.py", threads=2)
    plain, recomputed = (re.search(rf"{label}\s*: saved bytes\s+(\d+), forwards in forward (\d), forwards in backward (\d)",
                             out).groups() for label in ("plain", "recomputed"))
    assert int(recomputed[0]) < int(plain[0]) / 10 and (plain[1:], recomputed[1:]) == (("1", "0"), ("1", "1"))
    assert number_after("recomputed vs plain gradients, largest difference:", out) == 0
    assert all(d <= EXACT for d in numbers_after("largest gradient difference", out))
    assert "plain: stage forwards per step [4, 4] for m = 4" in out
    assert "recomputed: stage forwards per step [8, 8] for m = 4" in out
    assert number_after("recomputed / plain, summed over stages:", out) < 0.1


def test_ch8_interleaving_shrinks_the_theoretical_bubble():
    out = run_script(CH8 + "interleaved.py", threads=2)
    assert "rank 0: chunk 0 = stage 0, blocks [0, 1]; chunk 1 = stage 2, blocks [4, 5]" in out
    sims = numbers_after("simulated bubble:", out)
    theory = numbers_after("theory (p-1)/(v*m+p-1):", out)
    assert sims == theory == [0.2, 0.1111]
    assert all(d <= EXACT for d in numbers_after("largest gradient difference", out))
    assert numbers_after("theory", out)[-2:] == [0.2, 0.111]


def test_ch10_planner_tables_and_a_megatron_style_gpt3_layout():
    out = run_script(CH10 + "plan_three_machines.py")
    assert out.count("#  layout") == 3 and "derivation of rank 1:" in out
    first_rows = re.findall(r"^1\s+(dp\d+·tp\d+·pp\d+)", out, re.M)
    assert len(first_rows) == 3
    assert re.search(r"tp8·pp\d+", first_rows[2])        # GPT-3: tp fills the 8-GPU node
    position = number_after("best variant ranks", out)
    assert 1 <= position <= 10
    assert number_after("the same grid without its flags needs", out) > 80   # only fits with ZeRO-1 or SP


@pytest.mark.parametrize("how", [{"threads": 2}, mpi(2)], ids=["threads2", "mpi2"])
def test_ch10_planner_parameter_bytes_equal_the_real_model(how):
    out = run_script(CH10 + "check_memory.py", **how)
    diffs = numbers_after("difference", out)
    assert len(diffs) == 4 and all(d == 0 for d in diffs)
    assert len(numbers_after("activations planner", out)) == 2
