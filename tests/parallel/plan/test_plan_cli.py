"""`python -m parallel.plan` end to end, in a subprocess."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from parallel.plan.flags import build_parser, parse_size

ROOT = Path(__file__).resolve().parents[3]


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "parallel.plan", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_medium_on_four_laptop_ranks_with_explain():
    done = run("--config", "medium", "--devices", "4", "--mem-per-device", "8GB", "--batch", "32",
               "--device", "laptop-cpu", "--explain", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))
    for column in ("layout", "m", "flags", "params", "grads", "optim", "activ", "compute",
                   "comm", "bubble", "step s", "reason"):
        assert column in lines[header]
    assert lines[header + 1].split()[:2] == ["1", "dp4·tp1·pp1"]
    assert "12,938,240 parameters" in done.stdout
    assert "derivation of rank 1:" in done.stdout and "step time =" in done.stdout


def test_dims_given_directly_and_top():
    done = run("--n-layer", "2", "--d-model", "64", "--n-head", "4", "--vocab", "100", "--seq",
               "32", "--batch", "8", "--devices", "2", "--top", "3")
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("#  "):].splitlines()
    assert len(table) == 1 + 3


def test_bert_is_planned_with_its_own_parameter_count():
    from minitensor.models.bert import BERT, BertConfig

    done = run("--config", "small", "--model", "bert", "--devices", "2", "--top", "2")
    assert done.returncode == 0, done.stderr
    config = BertConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, d_model=128)
    assert f"{BERT(config).num_parameters():,} parameters" in done.stdout and "BertConfig(" in done.stdout


def test_bad_input_names_the_problem():
    done = run("--n-layer", "2", "--d-model", "64")
    assert done.returncode == 2 and "missing --n-head --vocab --seq" in done.stderr
    done = run("--config", "medium", "--explain", "999")
    assert done.returncode == 2 and "--explain 999" in done.stderr
    done = run("--config", "medium", "--device", "laptop-cpu", "--dtype", "mixed")
    assert done.returncode == 2 and "no peak flops for dtype 'mixed'" in done.stderr


def test_help_has_a_line_per_flag():
    text = build_parser().format_help()
    for flag in ("--config", "--n-layer", "--d-model", "--n-head", "--vocab", "--seq", "--batch",
                 "--devices", "--device", "--mem-per-device", "--dtype", "--schedule",
                 "--allow-inter-node-tp", "--top", "--explain", "--calibrate", "--output"):
        assert flag in text


def test_parse_size():
    assert parse_size("8GB") == 8 * 10**9
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("512mib") == 512 * 2**20
    assert parse_size("1e6") == 10**6
    with pytest.raises(Exception, match="cannot read memory size '8 bananas'"):
        parse_size("8 bananas")


def test_calibrate_writes_a_profile_the_planner_reads(tmp_path):
    path = tmp_path / "calibrated.json"
    done = run("--calibrate", "--output", str(path))
    assert done.returncode == 0, done.stderr
    profile = json.loads(path.read_text())
    assert profile["name"] == "laptop-cpu-calibrated"
    assert profile["peak_flops"]["float32"] > 1e8
    done = run("--config", "small", "--devices", "2", "--device", str(path))
    assert done.returncode == 0, done.stderr
    assert "laptop-cpu-calibrated" in done.stdout



def test_zero_bubble_schedules_are_choices_and_costed_as_such():
    done = run("--n-layer", "4", "--d-model", "64", "--n-head", "4", "--vocab", "100", "--seq", "32",
               "--batch", "8", "--devices", "4", "--device", "laptop-cpu", "--explain", "1", "--schedule", "zb-h1")
    assert done.returncode == 0, done.stderr
    assert "·t_stage (zb-h1)" in done.stdout
    bad = run("--n-layer", "4", "--d-model", "64", "--n-head", "4", "--vocab", "100", "--seq", "32",
              "--batch", "8", "--devices", "4", "--schedule", "zb-h3")
    assert bad.returncode == 2 and "'zb-h2'" in bad.stderr


def test_auto_shard_prints_megatrons_split_of_a_traced_block():
    done = run("--config", "small", "--devices", "2", "--batch", "2", "--auto-shard")
    assert done.returncode == 0, done.stderr
    assert "mlp.fc.weight S(0)" in done.stdout and "mlp.proj.weight S(1)" in done.stdout
    collectives = [line.split()[:2] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert collectives == [["forward", "all-reduce"]] * 2 + [["backward", "all-reduce"]] * 2


def test_simulate_adds_the_replayed_schedules_prediction_of_the_top_rows():
    done = run("--n-layer", "2", "--d-model", "16", "--n-head", "2", "--vocab", "16", "--seq", "8", "--batch", "4",
               "--devices", "2", "--top", "2", "--simulate")
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("simulated (schedule replayed"):].splitlines()
    assert table[1].split() == ["#", "layout", "m", "closed", "s", "simulated", "s"]
    assert [row.split()[0] for row in table[2:]] == ["1", "2"]
    assert all(float(row.split()[-1]) > 0 for row in table[2:])


def test_bf16_moments_print_8_bytes_of_optimizer_state_and_mixed_is_refused_in_one_line():
    done = run("--config", "medium", "--devices", "8", "--device", "a100-80gb", "--dtype", "bf16", "--moment-dtype",
               "bfloat16", "--top", "1")
    assert done.returncode == 0 and "dtype bf16+bf16-moments: 2 + 6 + 8 bytes per parameter" in done.stdout
    done = run("--config", "medium", "--devices", "8", "--device", "a100-80gb", "--dtype", "mixed", "--moment-dtype",
               "bfloat16")
    assert done.returncode == 2 and "bfloat16 moments need a policy" in done.stderr.splitlines()[-1]
