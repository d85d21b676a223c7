"""`python -m parallel.plan` on input too large to search: exit 2 and one line naming the flag
and its bound, at once, while the documented examples (and thousands of GPUs) stay inside."""
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from parallel.plan.__main__ import main
from parallel.plan.model import CONFIGS, GPTConfig
from parallel.plan.search import MAX_SEARCH_STEPS, divisors, grids, search_steps

ROOT = Path(__file__).resolve().parents[3]
MEDIUM = ["--config", "medium", "--devices", "4"]


def run(*args):
    """The CLI in a subprocess that may not take long: a hang fails the test, it does not stall it."""
    return subprocess.run([sys.executable, "-m", "parallel.plan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def error_line(argv, capsys):
    """The last stderr line of main(argv), which must exit 2 without a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_billion_devices_is_refused_at_once_with_the_bound():
    done = run("--config", "medium", "--devices", "1000000000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].endswith("--devices=1000000000 must be ≤ 1,000,000, the planner's bound")


@pytest.mark.parametrize("flag, value, bound", [
    ("--n-layer", "1000000000000", "100,000"), ("--d-model", "10000000000", "1,000,000"),
    ("--vocab", "10000000000", "10,000,000"), ("--seq", "10000000000", "16,777,216"),
    ("--batch", "1000000000000", "16,777,216"), ("--n-head", "10000000000", "1,000,000"),
])
def test_a_size_flag_beyond_its_bound_is_one_line(flag, value, bound, capsys):
    assert error_line([*MEDIUM, flag, value], capsys).endswith(f"{flag}={value} must be ≤ {bound}, the planner's bound")


def test_help_states_each_bound():
    help_text = " ".join(subprocess.run([sys.executable, "-m", "parallel.plan", "--help"], cwd=ROOT,
                                        capture_output=True, text=True).stdout.split())
    for text in ("number of devices (ranks), ≤ 1,000,000", "number of transformer blocks, ≤ 100,000",
                 f"refuses more than {MAX_SEARCH_STEPS:,} steps", "at most 2 GiB"):
        assert text in help_text


def test_a_search_over_its_bound_is_refused_before_it_starts():
    done = run("--config", "gpt3-175b", "--device", "a100-80gb", "--devices", "720720", "--batch", "720720",
               "--allow-inter-node-tp")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"steps, over its bound of {MAX_SEARCH_STEPS:,} (about a minute): give fewer --devices" in done.stderr


def test_longest_sequence_counts_all_its_searches(capsys):
    argv = ["--config", "gpt3-175b", "--device", "a100-80gb", "--devices", "1024", "--batch", "1536",
            "--longest-sequence"]
    assert "the search would take 48 searches × " in error_line(argv, capsys)


@pytest.mark.parametrize("config, devices, batch", [
    (CONFIGS["gpt3-175b"], 1024, 1536),  # the documented example
    (CONFIGS["gpt3-175b"], 3072, 1536),
    (GPTConfig(vocab_size=50257, block_size=2048, n_layer=200, n_head=160, d_model=25600), 3072, 3072),  # 1.6T
])
def test_thousands_of_gpus_stay_inside_the_search_bound(config, devices, batch):
    steps = search_steps(config, list(grids(config, devices, batch, 8, False, Counter())), batch)
    assert steps < MAX_SEARCH_STEPS


def test_divisors_in_root_n_trials_are_all_the_divisors():
    for n in range(1, 500):
        assert list(divisors(n)) == [d for d in range(1, n + 1) if n % d == 0]


def test_d_model_that_n_head_does_not_divide_is_one_line(capsys):
    line = error_line(["--config", "medium", "--d-model", "1001"], capsys)
    assert line.endswith("d_model=1001 is not divisible by n_head=8: give --d-model a multiple of --n-head")


def test_a_memory_size_starting_with_a_dash_says_to_attach_it_and_then_why_it_is_wrong(capsys):
    line = error_line([*MEDIUM, "--mem-per-device", "-8GB"], capsys)
    assert line.endswith("--mem-per-device: expected one argument "
                         "(a value starting with '-' must be attached: --mem-per-device=-8GB)")
    line = error_line([*MEDIUM, "--mem-per-device=-8GB"], capsys)
    assert line.endswith("memory size '-8GB' must be positive (try 8GB or 8GiB)")
    assert "not a finite number of bytes" in error_line([*MEDIUM, "--mem-per-device", "1e400"], capsys)


@pytest.mark.parametrize("argv, flag", [
    (["--config", "gpt3-175b", "--devices", "8", "--auto-shard"], "--auto-shard"),
    (["--config", "gpt2-124m", "--devices", "2", "--batch", "512", "--top", "400", "--simulate"], "--simulate"),
])
def test_measuring_a_block_too_large_for_this_machine_is_refused(argv, flag, capsys):
    line = error_line(argv, capsys)
    assert f"{flag} runs one block here and it would need" in line and "over the bound of 2 GiB" in line


HUGE = ["--n-layer", "65536", "--d-model", "65536", "--n-head", "512", "--vocab", "51200", "--seq", "2048",
        "--batch", "16777216", "--devices", "524288", "--device", "a100-80gb"]


def test_the_cluster_search_has_the_bound_of_the_layout_search():
    """--json ranks with the cluster search (text with the layout search, bounded above): it counts first,
    against the same bound, and is refused at once where it ran for minutes."""
    done = run(*HUGE, "--json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert re.search(r"the search would take [\d,]+ steps, over its bound of 100,000,000", done.stderr.splitlines()[-1])


def test_the_cluster_search_of_no_runnable_layout_explains_under_json(capsys):
    line = error_line(["--config", "gpt3-175b", "--devices", "1000000", "--device", "a100-80gb", "--batch", "1536",
                       "--json"], capsys)
    assert line.startswith("python -m parallel.plan: error: --json: no layout of 1000000 GPUs runs this model (of "
                           "the (tp, pp, dp) tried: ") and "does not divide n_head=96" in line


CLUSTER = ["--config", "gpt3-175b", "--device", "a100-80gb", "--batch", "1536"]


@pytest.mark.parametrize("argv, message", [
    ([*CLUSTER, "--devices", "3072", "--layout", "tp=²,pp=64,dp=6"], "--layout 'tp=²,pp=64,dp=6': 'tp=²' is not one"),
    ([*CLUSTER, "--devices", "3072", "--layout", ""], "--layout '': '' is not one of tp=, pp=, dp="),
    (["--validate-published", "--json"], "--validate-published runs the published layouts on their own devices "
                                         "and prints a table; it takes no --json"),
    (["--validate-published", "--layout", "tp=1,pp=1,dp=1", "--devices", "8"], "it takes no --layout, --devices"),
])
def test_a_flag_the_cluster_model_would_misread_or_ignore_is_one_line(argv, message, capsys):
    assert message in error_line(argv, capsys)
