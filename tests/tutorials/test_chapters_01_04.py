"""Chapters 1–4 run as their READMEs say (plain python, --threads N, mpiexec -n N) and print
the evidence their prose describes: each test parses the printed numbers and checks them."""
import math
import re

import pytest
from chapter_runner import number_after, numbers_after, run_script

CH1, CH2, CH3, CH4 = "tutorials/01_autograd", "tutorials/02_gpt", "tutorials/03_collectives", "tutorials/04_data_parallel"
BOTH_BACKENDS = [pytest.param(dict(threads=2), id="threads"), pytest.param(dict(mpi_ranks=2), id="mpiexec", marks=pytest.mark.deep)]


def backend_line(out, n, launch):
    backend = "mpi" if "mpi_ranks" in launch else "threads"
    assert f"parallel: {n} rank(s) on the {backend} backend" in out


# --- chapter 1 ---------------------------------------------------------------------------

def test_ch1_function_and_walk_prints_the_graph_the_walk_and_exact_gradients():
    out = run_script(f"{CH1}/function_and_walk.py")
    assert "3: Add(MatMul, b) -> (4, 3)" in out and "4: Softplus(Add) -> (4, 3)" in out
    assert "backward visits: Sum -> Softplus -> Add -> b -> MatMul -> w" in out  # each leaf after its op
    assert number_after("largest difference autograd vs hand-derived gradient", out) <= 1e-12
    assert number_after("largest difference for the tensor used twice", out) == 0
    assert "a second backward() raises RuntimeError" in out


def test_ch1_gradcheck_passes_softplus_rejects_one_percent_and_prints_the_graph():
    out = run_script(f"{CH1}/gradcheck_and_graph.py")
    assert number_after("difference of one central-difference estimate", out) < 1e-8
    assert "gradcheck(Softplus) on a (3, 4) input: passed = True" in out
    analytic, numeric = (float(v) for v in re.search(r"OnePercentOff.*analytic (\S+), numeric (\S+),", out).groups())
    assert analytic / numeric == pytest.approx(1.01, rel=1e-6)
    flops = [int(v.replace(",", "")) for v in re.findall(r"^MatMul\s+\(\d+, \d+\)\s+([\d,]+)", out, re.M)]
    assert flops == [2 * 8 * 16 * 32, 2 * 8 * 32 * 10]
    total = int(re.search(r"forward FLOPs: ([\d,]+)", out).group(1).replace(",", ""))
    assert sum(flops) < total < 1.1 * sum(flops)
    assert len(re.findall(r"^  t\d+ \[shape=box", out, re.M)) == 4 and "digraph minitensor" in out
    assert 'label="w1\\n(16, 32)"' in out and 'label="w2\\n(32, 10)"' in out  # leaves by name
    assert "subgraph cluster_legend" in out


# --- chapter 2 ---------------------------------------------------------------------------

def test_ch2_parameters_and_matmul_flops_match_their_formulas_layer_by_layer():
    out = run_script(f"{CH2}/gpt_anatomy.py", "--batch", 8)
    counted = number_after("parameters counted", out)
    assert counted == number_after("2d + V·d", out)
    assert number_after("matmul FLOPs of the whole forward (graph)", out) == number_after("4·L·B·T²·d", out)
    assert number_after("matmuls are", out) > 99
    assert "the same total as the per-module sum above: True" in out
    rows = dict((name.strip(), (int(p.replace(",", "")), int(f.replace(",", ""))))
                for name, p, f in re.findall(r"^(\S.*?)\s+([\d,]+)\s+([\d,]+)$", out, re.M))
    assert rows["total"][0] == counted
    d, tokens = 128, 8 * 8  # --batch 8 of the 2-digit task's 8-character inputs
    assert rows["blocks.0.mlp (fc, gelu, proj)"][0] == 8 * d * d + 5 * d
    assert rows["blocks.0.attn (q, k, v, softmax, proj)"][0] == 4 * d * d + 4 * d
    mlp_matmuls = 2 * tokens * 8 * d * d
    assert mlp_matmuls < rows["blocks.0.mlp (fc, gelu, proj)"][1] < 1.01 * mlp_matmuls


def test_ch2_training_on_addition_makes_the_loss_fall():
    out = run_script(f"{CH2}/train_addition.py", "--steps", 120)
    first = number_after("first loss", out)
    assert abs(first - number_after("ln 12 =", out)) < 0.2  # a fresh model guesses uniformly
    last = float(re.search(r"mean loss of the last 20 steps: (\S+)", out).group(1))
    assert last < 0.75 * first
    answers = re.findall(r"model says\s+\d+\s+(right|wrong)", out)
    assert len(answers) == 6
    matched = 200 * number_after("held-out exact match on 200 problems", out)  # printed with 3 decimals
    assert matched == round(matched) and 0 <= matched <= 200  # a count of whole answers out of 200


# --- chapter 3 ---------------------------------------------------------------------------

@pytest.mark.parametrize("launch", BOTH_BACKENDS + [pytest.param(dict(threads=3), id="threads-3")])
def test_ch3_every_collective_matches_numpy(launch):
    out = run_script(f"{CH3}/collectives.py", **launch)
    n = launch.get("threads", launch.get("mpi_ranks"))
    backend_line(out, n, launch)
    for op in ("send/recv", "broadcast", "all_gather", "reduce_scatter", "all_reduce"):
        assert number_after(f"{op} matches numpy on every rank: largest difference", out) == 0
    total = sum(10 * r for r in range(n))  # element 0 of the sum: every rank's 10r
    assert re.search(rf"after\s+rank 0: \[\s*{total} ", out.split("all_reduce:")[1])


@pytest.mark.parametrize("launch", [pytest.param(dict(threads=3), id="threads-3"),
                                    pytest.param(dict(mpi_ranks=2), id="mpiexec-2")])
def test_ch3_ring_steps_end_fully_reduced_and_send_the_formula_bytes(launch):
    out = run_script(f"{CH3}/ring_allreduce.py", "--elements", 12_000, **launch)
    n = launch.get("threads", launch.get("mpi_ranks"))
    full = "{" + ",".join(map(str, range(n))) + "}"
    steps = re.findall(r"^(reduce-scatter|all-gather) step", out, re.M)
    assert steps == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
    final = out.split("all-gather step")[-1]
    for r in range(n):
        cells = re.search(rf"rank {r}  (.*)", final).group(1).split()
        assert cells == [full] * n
    after_rs = out.split("reduce-scatter step")[n - 1].split("all-gather")[0]
    assert after_rs.count(full) == n  # after reduce-scatter each rank holds exactly one finished chunk
    assert number_after("largest difference ring vs builtin all-reduce", out) <= 1e-12
    formula = 2 * (n - 1) * 12_000 * 8 // n
    sent = [int(v.replace(",", "")) for v in re.findall(r"sent ([\d,]+) bytes in the ring", out)]
    assert sent == [formula] * n
    assert f"formula 2(n-1)/n x buffer bytes: {formula:,}; group.stats() counted {formula:,}" in out


@pytest.mark.parametrize("launch", BOTH_BACKENDS)
def test_ch3_bandwidth_prints_a_row_per_size_and_the_fit(launch):
    out = run_script(f"{CH3}/bandwidth.py", "--max-kib", 1024, **launch)
    assert len(re.findall(r"^\s+\d+ [KM]iB ", out, re.M)) == 6  # 1 KiB ... 1 MiB
    # measured speeds are printed, not asserted: the tests may share a busy machine
    for label in ("busbw of the smallest size", "busbw of the largest size"):
        assert number_after(label, out) > 0
    assert math.isfinite(number_after("fitted alpha (latency per step)", out))
    assert math.isfinite(numbers_after("fitted beta", out)[0])
    assert number_after("largest model/measured ratio", out) >= 1


# --- chapter 4 ---------------------------------------------------------------------------

@pytest.mark.parametrize("launch", BOTH_BACKENDS)
def test_ch4_averaged_gradients_equal_one_device(launch):
    out = run_script(f"{CH4}/average_gradients.py", **launch)
    backend_line(out, 2, launch)
    assert number_after("largest loss difference vs one device", out) <= 1e-12
    assert numbers_after("relative to max(1, |grad|))", out)[0] <= 1e-12
    calls = int(re.search(r"all_reduce calls: (\d+) for the gradients", out).group(1))
    assert calls == 37
    elements, params = re.search(r"reduced per rank: ([\d,]+) \(the model has ([\d,]+) parameters", out).groups()
    assert elements == params


@pytest.mark.parametrize("launch", BOTH_BACKENDS)
def test_ch4_buckets_fill_in_order_and_grads_equal_one_device(launch):
    out = run_script(f"{CH4}/buckets_overlap.py", **launch)
    n_buckets = int(re.search(r"^(\d+) buckets", out, re.M).group(1))
    assert n_buckets > 2
    assert number_after("all_reduce calls in this backward", out) == n_buckets
    assert number_after("largest gradient difference vs one device, overlapped", out) <= 1e-12
    assert number_after("largest gradient difference vs one device, all-reduce after backward", out) <= 1e-12
    timeline = out.split("gradient ready (backward order)")[1].split("buckets whose")[0].strip().splitlines()[1:]
    rows = [line.split()[2:] for line in timeline]  # name, bucket, then one cell per bucket
    assert len(rows) == 37 and all(len(cells) == n_buckets for cells in rows)
    assert rows[-1] == ["done"] * n_buckets
    for cells in rows[:-1]:  # a bucket is SENT only after every earlier one; the rest show ready/total
        sent = [c == "SENT" for c in cells]
        assert sent == sorted(sent, reverse=True)
        assert all(re.fullmatch(r"\d+/\d+", c) for c in cells[sum(sent):])
    assert timeline[0].split()[0] == "lm_head.weight"  # backward's first gradient fills bucket 0 first
    # overlap: every bucket but the last (the embeddings' gradients come last) is in flight before backward ends
    assert numbers_after("started before the last gradient was ready", out)[0] == n_buckets - 1


@pytest.mark.parametrize("launch", BOTH_BACKENDS)
def test_ch4_zero1_shards_the_state_same_bytes_same_parameters(launch):
    out = run_script(f"{CH4}/zero1_memory.py", **launch)
    adamw = number_after("optimizer state per rank, AdamW", out)
    zero = number_after("optimizer state per rank, ZeRO-1", out)
    params = int(re.search(r"([\d,]+) float64 parameters", out).group(1).replace(",", ""))
    assert adamw == 2 * 8 * params and zero == 2 * 8 * params / 2
    assert number_after("ZeRO-1 saving", out) == 2
    bars = re.findall(r"rank \d (#+)\s+([\d,]+) bytes", out)
    assert [len(b) for b, _ in bars] == [40, 40, 20, 20]
    assert number_after("per step, DataParallel (all_reduce)", out) == number_after(
        "per step, ZeRO-1 (reduce_scatter + all_gather)", out)
    for label in ("DataParallel", "ZeRO-1"):
        assert number_after(f"after 3 steps vs one device, {label}", out) <= 1e-9
