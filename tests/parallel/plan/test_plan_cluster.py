"""The GPU-cluster model (parallel.plan.cluster), its CLI, and the published runs it is judged on.

Also the standing check of the time model on this machine (issue 34): from the chapter's committed
measurements, the simulation orders every 2-rank layout with Spearman ρ ≥ 0.8 and predicts every
layout within 25% on 2 and on 4 ranks.
"""
import json

import pytest
from mpi_launch import REPO
from published_argv import published_argv

from parallel.plan import get_config, load_profile
from parallel.plan.__main__ import main
from parallel.plan.cluster import activation_bytes, block_seconds, gemm_seconds, group_link, model_flops, step
from parallel.plan.cluster_cli import parse_layout
from parallel.plan.published import TABLE_1, TABLE_5, row_config, validate_published, validate_table_5
from parallel.plan.rank_stats import spearman
from parallel.plan.validate import merge, predictions

A100 = load_profile("a100-80gb")
GPU = A100["cluster"]
ONE_T = published_argv(TABLE_1[9])


def test_small_gemms_run_below_peak_and_a_partial_wave_costs_a_whole_one():
    rate = GPU["peak_flops"] * GPU["gemm_efficiency"]
    big = gemm_seconds(GPU, 8192, 8192, 8192)
    assert 2 * 8192**3 / big == pytest.approx(rate, rel=0.02)          # large: the tiles fill every wave
    small = gemm_seconds(GPU, 512, 512, 512)
    assert 2 * 512**3 / small < 0.35 * rate                              # 32 tiles of 128 × 64 on 108 SMs
    # 108 tiles of 128 × 64 fill one wave; one more column costs a second wave (or bigger tiles): 2×
    assert gemm_seconds(GPU, 128 * 27, 64 * 4 + 1, 4096) == pytest.approx(2 * gemm_seconds(GPU, 128 * 27, 64 * 4, 4096))
    scores = gemm_seconds(GPU, 2048, 2048, 64, batch=64)                 # K = 64: memory-bound
    assert scores == pytest.approx(2 * 64 * (2 * 2048 * 64 + 2048**2) / (GPU["hbm_bytes_per_s"] * GPU["hbm_efficiency"]))


def test_groups_across_nodes_move_at_one_nic_per_member_per_node():
    _, beta_nvlink = group_link(GPU, 1, 8)
    _, beta_one = group_link(GPU, 8, 32)                                  # tp = 8: one member per node
    _, beta_four = group_link(GPU, 2, 64)                                 # four members per node
    nic = GPU["nic_bytes_per_s"] * GPU["nic_efficiency"]
    assert 1 / beta_one == pytest.approx(nic) and 1 / beta_four == pytest.approx(4 * nic)
    assert 1 / beta_nvlink == pytest.approx(GPU["nvlink_bytes_per_s"] * GPU["nvlink_efficiency"])


def test_model_flops_are_the_papers_eq_3():
    config = row_config(TABLE_1[-1])                                     # 1T: B 3072, s 2048, l 128, h 25600
    by_hand = 96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    assert model_flops(config, 3072) == pytest.approx(by_hand)
    # 502 PFLOP/s aggregate (the paper's abstract) is 163 TFLOP/s per GPU on 3072 GPUs
    assert 502e15 / 3072 / 1e12 == pytest.approx(163, abs=0.5)


def test_the_step_adds_up_and_interleaving_shrinks_the_bubble():
    config = row_config(TABLE_1[-1])
    plain, inter = (step(config, A100, 3072, 8, 64, 6, 1, v) for v in (1, 2))
    parts = plain.seconds
    assert parts["step"] == pytest.approx(parts["compute"] + parts["tp"] + parts["pp"] + parts["bubble"]
                                          + parts["dp"] + parts["embedding_sync"] + parts["optimizer"])
    assert inter.seconds["bubble"] == pytest.approx(plain.seconds["bubble"] / 2, rel=0.05)
    assert inter.seconds["pp"] == pytest.approx(2 * plain.seconds["pp"])
    assert plain.fits and inter.fits and inter.tflops > plain.tflops


def test_selective_recomputation_reruns_only_core_attention():
    """GPT-3 175B (Korthikanti et al.'s Table 3), t = 8, b = 1: selective saves exactly the second forward of the
    four linear GEMMs, the LayerNorms and bias-dropout-adds' 22h bytes per token, the bias-GELU's 16h/t, and
    two of the six tp all-reduces; core attention (its two batched GEMMs, softmax, dropout) still reruns."""
    config, t, b = row_config(TABLE_5[1]), 8, 1
    T, h = 2048 * b, 12288
    full, selective = block_seconds(config, GPU, t, b), block_seconds(config, GPU, t, b, "selective")
    linear_forwards = (gemm_seconds(GPU, T, 3 * h // t, h) + gemm_seconds(GPU, T, h, h // t)
                       + gemm_seconds(GPU, T, 4 * h // t, h) + gemm_seconds(GPU, T, h, 4 * h // t))
    assert full["gemm"] - selective["gemm"] == pytest.approx(linear_forwards)
    rate = GPU["peak_flops"] * GPU["gemm_efficiency"]
    assert linear_forwards == pytest.approx(2 * T * 12 * h * h / t / rate, rel=0.05)   # 24·T·h²/t flops
    hbm = GPU["hbm_bytes_per_s"] * GPU["hbm_efficiency"]
    assert full["memory"] - selective["memory"] == pytest.approx((22 + 16 / t) * T * h / hbm)
    alpha, beta = GPU["nvlink_alpha_us"] * 1e-6, 1 / (GPU["nvlink_bytes_per_s"] * GPU["nvlink_efficiency"])
    one_all_reduce = 2 * (t - 1) * (alpha + 2 * T * h / t * beta)
    assert full["tp"] == pytest.approx(6 * one_all_reduce) and selective["tp"] == pytest.approx(4 * one_all_reduce)


def test_sequence_parallelism_splits_the_layernorms_and_dropouts_and_moves_the_same_bytes():
    config, t, b = row_config(TABLE_5[1]), 8, 1
    T, h = 2048 * b, 12288
    plain, sp = (block_seconds(config, GPU, t, b, "selective", on) for on in (False, True))
    hbm = GPU["hbm_bytes_per_s"] * GPU["hbm_efficiency"]
    # LayerNorms + bias-dropout-adds: 22h forward + 24h backward per token, now on T/t tokens per rank
    assert plain["memory"] - sp["memory"] == pytest.approx(46 * T * h * (1 - 1 / t) / hbm)
    assert sp["gemm"] == plain["gemm"]
    # an all-gather + a reduce-scatter of the 2·T·h bytes: (t − 1) steps of 2Th/t each, twice = one ring all-reduce
    alpha, beta = GPU["nvlink_alpha_us"] * 1e-6, 1 / (GPU["nvlink_bytes_per_s"] * GPU["nvlink_efficiency"])
    assert sp["tp"] == pytest.approx(4 * 2 * (t - 1) * (alpha + 2 * T * h / t * beta)) == plain["tp"]


def test_activation_memory_follows_korthikanti_et_al():
    """1T (t = 8, p = 64, 1F1B, b = 1, m = 512): stage 0 holds min(m, p) = 64 micro-batches of 2 blocks.
    Kept per block (bytes, the paper's formulas at b = 1): selective + SP 34·s·h/t; selective without SP
    s·h·(10 + 24/t) (LayerNorm and dropout inputs replicated); full 2·s·h, / t with SP. Plus the block being
    recomputed: full, all of its activations (with their 5·a·s²/t scores); selective, its scores alone."""
    config = row_config(TABLE_5[3])
    s, h, a, t = 2048, 25600, 160, 8
    scores = 5 * a * s * s / t
    assert activation_bytes(config, 1, t, 64, 1, 512, "selective", True) == pytest.approx(128 * 34 * s * h / t + scores)
    assert activation_bytes(config, 1, t, 64, 1, 512, "selective") == pytest.approx(128 * s * h * (10 + 24 / t) + scores)
    assert activation_bytes(config, 1, t, 64, 1, 512, "full", True) == pytest.approx(
        128 * 2 * s * h / t + 34 * s * h / t + scores)
    assert activation_bytes(config, 1, t, 64, 1, 512) == pytest.approx(128 * 2 * s * h + s * h * (10 + 24 / t) + scores)
    # interleaved, v = 2: min(m·v, 2(p − 1) + (v − 1)p + 1) = 191 chunk-micro-batches of one block
    assert activation_bytes(config, 1, t, 64, 2, 512, "selective", True) == pytest.approx(191 * 34 * s * h / t + scores)


def test_sequence_parallelism_needs_tensor_parallelism():
    with pytest.raises(ValueError, match="sequence parallelism needs tp > 1"):
        step(row_config(TABLE_1[0]), A100, 512, 1, 1, 32, 16, recompute="selective", sequence_parallel=True)
    with pytest.raises(ValueError, match="is not one of"):
        step(row_config(TABLE_1[0]), A100, 512, 1, 1, 32, 16, recompute="none")


def test_the_1t_model_does_not_fit_without_model_parallelism():
    config = row_config(TABLE_1[-1])
    assert not step(config, A100, 3072, 8, 4, 96, 1).fits               # 31 B params / GPU × 16 B
    with pytest.raises(ValueError, match="interleaving: pp·v = 144 does not divide n_layer=128"):
        step(config, A100, 3072, 8, 48, 8, 1, v=3)
    with pytest.raises(ValueError, match="pp=256 stages exceed n_layer=128 blocks"):
        step(config, A100, 4096, 1, 256, 16, 1)


def test_table_1_is_predicted_within_10_percent_and_the_papers_layout_ranks_high():
    """Goal (issue 34): every row within 15% and the paper's (t, p) in the top 5. Each row is judged at the run
    the paper measured (t, p, b, v and DDP of the authors' run_table_1.sh), out of sample: the one fitted
    constant (gemm_efficiency) comes from Table 2. Today: every row within 10% (the four p = 1 rows, whose
    torch DDP hides the dp all-reduce, the four most over-predicted), 8 of 10 in the top 5 (all in the top 6;
    the search tries torch DDP where p = 1, as the paper's runs did): a guard against regressions, and the
    chapter says why."""
    lines = []
    results = validate_published(out=lines.append)
    errors = [r["error"] for r in results]
    assert len(results) == 10 and all(abs(e) < 0.10 for e in errors)
    assert sorted(errors, reverse=True)[:4] == errors[:4]                # torch DDP's rows (p = 1) the highest
    assert all(r["rank"] is not None and r["rank"] <= 6 for r in results)
    assert sum(r["rank"] <= 5 for r in results) >= 8
    assert all(r["step"].fits for r in results)
    assert [(r["step"].micro_batch, r["step"].chunks) for r in results] == [row[8:10] for row in TABLE_1]
    assert lines[12].startswith("largest error")         # Table 1's summary; the held-out checks follow it


def test_the_held_out_table_5_is_printed_after_table_1_and_predicted():
    """Korthikanti et al. 2022 (nothing fitted on it): every model, each of its recomputation modes, one line
    after Table 1's summary. Today every row is within 11%, and the 530B and 1T runs, in print 8-10% faster
    than the same runs of 2021, under-predicted by 9-11% (the model is calibrated on the 2021 code): a guard
    against regressions."""
    lines = []
    validate_published(out=lines.append)
    table_1_end = next(i for i, line in enumerate(lines) if line.startswith("largest error"))
    assert table_1_end == 12 and "Korthikanti et al. 2022" in lines[table_1_end + 2]
    for row in TABLE_5:
        for mode, seconds in (("full", row[8]), ("selective + SP", row[9])):
            assert any(line.startswith(f"{row[0]:>7}B") and mode in line and f"{seconds:.2f}" in line
                       for line in lines[table_1_end:])
    results = validate_table_5(A100, out=lambda line: None)
    full = [r for r in results if r["mode"] == "full"]
    assert len(results) == 8 and len(full) == 4 and all(r["step"].fits for r in results)
    assert all(abs(r["error"]) < 0.11 for r in results)
    assert all(-0.11 < r["error"] < -0.09 for r in full[2:])            # 530B and 1T: the 2022 code is faster
    assert all(r["published"] / r["predicted"] - 1 == pytest.approx(r["error"]) for r in results)


def test_the_530b_and_1t_runs_of_both_papers_differ_in_print_but_not_in_the_model():
    """Chapter 10's argument: 530B and 1T ran with the same t, p and micro-batches per pipeline in 2021 (dp 9
    and 6) and 2022 (dp 1). In print the 2021 runs are 8-10% slower (eq. 3 TFLOP/s per GPU, from the
    published seconds by hand); the model, at the 2021 scripts' b and v for both (Table 5 gives neither), where
    only the dp all-reduce differs, within 1%."""
    results_1 = validate_published(out=lambda line: None)
    for i1, i5 in ((8, 2), (9, 3)):
        row, (*_, t, p, _, _, b, v, _, published_2021) = TABLE_5[i5], TABLE_1[i1]
        published_2022 = model_flops(row_config(row), row[7]) / (row[8] * row[6]) / 1e12
        assert 0.08 < published_2022 / published_2021 - 1 < 0.11
        run_2022 = step(row_config(row), A100, row[7], t, p, 1, b, v)
        assert run_2022.tflops == pytest.approx(results_1[i1]["predicted"], rel=0.01)


def test_the_json_cli_prints_one_object_with_the_stable_keys(capsys):
    assert main([*ONE_T, "--layout", "tp=8,pp=64,dp=6,m=1,v=2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"step_seconds", "tflops_per_device", "memory_bytes_per_device"} <= set(out)
    assert out["layout"] == {"tp": 8, "pp": 64, "dp": 6, "micro_batch": 1, "micro_batches": 512, "v": 2,
                             "recompute": "full", "split": [2] * 64, "schedule": "1f1b"}
    assert 100 < out["tflops_per_device"] < 250 and out["fits"]


def test_without_m_or_v_the_cli_picks_the_fastest(capsys):
    assert main([*ONE_T, "--layout", "tp=8,pp=64,dp=6", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    for v in (1, 2):                                                     # 2 blocks per stage
        assert main([*ONE_T, "--layout", f"tp=8,pp=64,dp=6,m=1,v={v}", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["step_seconds"] >= best["step_seconds"] - 1e-9


@pytest.mark.parametrize("layout, message", [("tp=8,pp=64", "lacks dp"), ("tp=8,pp=64,dp=5", "is not --devices"),
                                             ("tp=8,pp=64,dp=6,x=2", "is not one of"),
                                             ("tp=8,pp=64,dp=6,v=3", "does not divide n_layer")])
def test_bad_layouts_fail_with_one_line(layout, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*ONE_T, "--layout", layout])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_profile_without_cluster_figures_is_refused(capsys):
    with pytest.raises(SystemExit):
        main([*published_argv(TABLE_1[9], device="laptop-cpu"), "--layout", "tp=8,pp=64,dp=6"])
    assert "no 'cluster' figures" in capsys.readouterr().err


def test_parse_layout():
    assert parse_layout("tp=2,pp=4,dp=8,m=2,v=3") == {"tp": 2, "pp": 4, "dp": 8, "m": 2, "v": 3}
    assert parse_layout("tp=8,pp=8,dp=1,recompute=selective,sp=1") == {"tp": 8, "pp": 8, "dp": 1,
                                                                      "recompute": "selective", "sp": True}
    assert parse_layout("tp=8,pp=8,dp=1,recompute=full,sp=0")["sp"] is False
    assert parse_layout("tp=1,pp=1,dp=32,ddp=torch")["ddp"] == "torch"


def test_the_cli_costs_korthikanti_et_als_modes_as_the_model_does(capsys):
    """--layout's recompute= and sp= reach the model: the JSON is the Step of those modes, and they
    are faster than full recomputation on the same layout (the 175B row of Table 5)."""
    gpt_175b = published_argv(TABLE_5[1])
    seconds = {}
    for mode in ("", ",recompute=selective,sp=1"):
        assert main([*gpt_175b, "--layout", f"tp=8,pp=8,dp=1,m=2,v=6{mode}", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        seconds[mode] = out["step_seconds"]
    assert out["layout"]["recompute"] == "selective" and out["sequence_parallel"] is True
    expected = step(row_config(TABLE_5[1]), A100, 64, 8, 8, 1, 2, 6, "selective", True)
    assert seconds[",recompute=selective,sp=1"] == pytest.approx(expected.seconds["step"], rel=1e-12)
    assert seconds[",recompute=selective,sp=1"] < 0.8 * seconds[""]


@pytest.mark.parametrize("layout, message", [("tp=8,pp=8,dp=1,sp=2", "sp is one of 0, 1"),
                                             ("tp=8,pp=8,dp=1,recompute=some", "recompute is one of full, selective"),
                                             ("tp=1,pp=8,dp=8,sp=1", "sequence parallelism needs tp > 1"),
                                             ("tp=8,pp=8,dp=1,ddp=fast", "ddp is one of local, torch"),
                                             ("tp=8,pp=8,dp=1,ddp=torch", "torch DDP needs pp = 1")])
def test_bad_modes_fail_with_one_line_naming_the_value(layout, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--n-layer", "96", "--d-model", "12288", "--n-head", "96", "--vocab", "51200", "--seq", "2048",
              "--batch", "64", "--devices", "64", "--device", "a100-80gb", "--layout", layout])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_validate_published_cli(capsys):
    assert main(["--validate-published"]) == 0
    out = capsys.readouterr().out
    assert "Narayanan et al. 2021" in out and "1008.0B" in out


@pytest.mark.parametrize("ranks", [2, 4])
def test_this_machines_time_model_meets_the_issues_bar(ranks):
    """Simulated step times from the chapter's measurements: every one within 25%; ρ ≥ 0.8 on 2 ranks."""
    path = REPO / f"tutorials/10_planner/measured/validate_{ranks}_ranks.jsonl"
    results, parts, link = merge(path.read_text().splitlines())
    simulated = predictions(get_config("medium"), 8, load_profile("laptop-cpu"), results, parts, link)["simulated"]
    measured = [r["seconds"] for r in results]
    assert len(measured) == 24 and all(abs(p - m) / m <= 0.25 for p, m in zip(simulated, measured))
    if ranks == 2:
        assert spearman(simulated, measured) >= 0.8


def load_at_scale():
    import importlib.util
    spec = importlib.util.spec_from_file_location("at_scale", REPO / "tutorials/10_planner/at_scale.py")
    at_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(at_scale)
    return at_scale


def test_chapter_10_at_scale_prints_the_readmes_table(capsys):
    """tutorials/10_planner/at_scale.py prints the table the README shows (its text form)."""
    assert load_at_scale().main([]) == 0
    printed = capsys.readouterr().out.splitlines()[1:]
    readme = (REPO / "tutorials/10_planner/README.md").read_text()
    assert all(line in readme for line in printed)


def test_chapter_10_at_scale_draws_its_picture(tmp_path):
    pytest.importorskip("matplotlib", reason="!!! matplotlib is not installed (pip install -e '.[plots]'): the "
                                             "at-scale picture was NOT rendered (its table was checked) !!!")
    results = validate_published(out=lambda line: None)
    assert load_at_scale().render(results, tmp_path / "at_scale.png").stat().st_size > 10_000


def test_the_pictures_table_5_points_are_eq_3_throughput_of_the_published_and_predicted_seconds():
    """Table 5 is in seconds; the picture puts it on Table 1's axis: eq. 3's flops per GPU over each time."""
    points = load_at_scale().table_5_points()
    assert [len(p) for p in points.values()] == [4, 4] and set(points) == {"full", "selective + SP"}
    row = TABLE_5[3]                                                    # 1T, 512 GPUs, batch 512
    eq_3 = 96 * 512 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    label, published, predicted = points["selective + SP"][3]
    assert label == "1000B" and published == pytest.approx(eq_3 / (row[9] * 512) / 1e12, rel=1e-12)
    step_1t = next(r["step"] for r in validate_table_5(A100, out=lambda line: None)
                   if r["mode"] == "selective + SP" and r["published"] == row[9])
    assert predicted == pytest.approx(eq_3 / (step_1t.seconds["step"] * 512) / 1e12, rel=1e-12)

