"""`python -m parallel.train --experts E`: the mixture of experts over dp × ep, with tp, pp, cp or
any ZeRO stage beside, equals one device under --check (threads, and the composition's proof on
real mpiexec ranks); a checkpoint reshards to another ep and to one device; every bad or
not-yet-composed combination is exit status 2 with one line."""
import json
import os
import re
import resource
import subprocess
import sys

import pytest
from mpi_launch import requires_mpiexec, run_mpi

from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2"]
ERROR = "python -m parallel.train: error: "


@pytest.mark.parametrize("layout", [["--threads", "2", "--dp", "2", "--ep", "2", "--capacity-factor", "1.0"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--tp", "2", "--zero", "1"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--pp", "2", "--microbatches", "2",
                                     "--schedule", "zb-h1", "--recompute-activations"],
                                    ["--threads", "4", "--dp", "4", "--ep", "2", "--top-k", "1", "--moe-every", "2",
                                     "--microbatches", "2", "--z-loss-coef", "0.01"],
                                    ["--threads", "4", "--dp", "4", "--ep", "2", "--zero", "2"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--cp", "2", "--zero", "3",
                                     "--aux-loss-coef", "0.1"]])
def test_check_equals_one_device(layout, capsys):
    result = main(TINY + ["--experts", "4", "--steps", "3", "--check", "3"] + layout)
    out = capsys.readouterr().out
    assert result["check"] < 1e-9 and out.count("check step") == 3
    assert "ep all_to_all" in out and "4 experts (top-" in out


DEEPSEEK = ["--router-score", "sigmoid", "--shared-experts", "1", "--expert-hidden", "8", "--expert-bias-rate", "0.05"]


# Issue 45: sigmoid scores, a shared expert, fine-grained width and the loss-free bias, beside every axis
@pytest.mark.parametrize("layout", [["--threads", "4", "--dp", "2", "--ep", "2", "--tp", "2", "--zero", "3"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--pp", "2", "--microbatches", "2",
                                     "--moe-every", "2", "--recompute-activations", "--zero", "1"],
                                    ["--threads", "4", "--dp", "2", "--ep", "2", "--cp", "2", "--zero", "2"],
                                    ["--threads", "4", "--dp", "4", "--ep", "4", "--experts", "8", "--top-k", "4",
                                     "--max-ranks-per-token", "2", "--zero", "3"]])
def test_deepseek_routing_equals_one_device(layout, capsys):
    result = main(TINY + ["--experts", "4", "--top-k", "2", "--steps", "3", "--check", "3"] + DEEPSEEK + layout)
    assert result["check"] < 1e-9 and capsys.readouterr().out.count("check step") == 3


# the second: device-limited routing (M = 2 of ep = 4), each token's rows one per (token, rank)
@requires_mpiexec
@pytest.mark.parametrize("layout", [["--ep", "2", "--zero", "2"],
                                    ["--ep", "4", "--experts", "8", "--top-k", "4", "--max-ranks-per-token", "2"]])
def test_deepseek_routing_equals_one_device_on_four_real_ranks(layout):
    result = run_mpi(4, ["-m", "parallel.train", *TINY, "--experts", "4", "--steps", "2", "--check", "2", *DEEPSEEK,
                         "--dp", "4", *layout], timeout=240)
    assert re.search(r"^check: largest relative difference to one device over 2 step\(s\): \S+e-1\d \(tolerance",
                     result.stdout, re.MULTILINE), result.stdout


# The composition's proof (issue 44): the replica synchronisations of ZeRO-2/3 and the cp ring take a
# mixture of experts with no branch of their own; every rank's check must pass, on real ranks.
@requires_mpiexec
@pytest.mark.parametrize("layout", [["--dp", "4", "--ep", "2", "--zero", "2"], ["--dp", "4", "--ep", "2", "--zero", "3"],
                                    ["--dp", "2", "--ep", "2", "--cp", "2"],
                                    ["--dp", "2", "--ep", "2", "--tp", "2", "--zero", "3"],
                                    ["--dp", "2", "--ep", "2", "--pp", "2", "--zero", "2", "--microbatches", "2"]])
def test_experts_with_zero_2_3_and_cp_equal_one_device_on_four_real_ranks(layout):
    result = run_mpi(4, ["-m", "parallel.train", *TINY, "--experts", "4", "--steps", "2", "--check", "2", *layout],
                     timeout=240)
    worst = re.search(r"^check: largest relative difference to one device over 2 step\(s\): (\S+) \(tolerance 1e-09",
                      result.stdout, re.MULTILINE)
    assert worst and float(worst.group(1)) < 1e-9, result.stdout
    assert re.search(r"^  ep all_to_all +\d+ calls", result.stdout, re.MULTILINE), result.stdout


# Issue 45: the batch-scope balancing loss (Switch's, over every token of a micro-batch) averages its shares f
# over dp × cp; one device runs the same global micro-batches. Each layout on real ranks.
@requires_mpiexec
@pytest.mark.parametrize("layout", [["--dp", "4", "--ep", "2"], ["--dp", "2", "--cp", "2", "--ep", "2"],
                                    ["--dp", "2", "--tp", "2"],
                                    ["--dp", "2", "--pp", "2", "--microbatches", "2", "--capacity-factor", "1.0"]])
def test_the_batch_scope_balancing_loss_equals_one_device_on_four_real_ranks(layout):
    result = run_mpi(4, ["-m", "parallel.train", *TINY, "--experts", "4", "--steps", "2", "--check", "2",
                         "--aux-loss-coef", "0.1", "--aux-loss-scope", "batch", *layout], timeout=240)
    worst = re.search(r"^check: largest relative difference to one device over 2 step\(s\): (\S+) \(tolerance 1e-09",
                      result.stdout, re.MULTILINE)
    assert worst and float(worst.group(1)) < 1e-9, result.stdout


@pytest.mark.parametrize("flags, message", [
    (["--experts", "6", "--ep", "4", "--dp", "4", "--threads", "4"], "--experts 6 is not divisible by --ep 4"),
    (["--experts", "2", "--top-k", "3"], "--top-k 3 exceeds --experts 2"),
    (["--experts", "4", "--top-k", "1", "--router-score", "sigmoid"], "--router-score sigmoid with --top-k 1"),
    (["--experts", "4", "--expert-bias-rate", "-0.1"], "--expert-bias-rate"),
    (["--shared-experts", "1"], "--shared-experts 1 needs --experts E"),
    (["--experts", "4", "--ep", "2", "--dp", "2", "--threads", "2", "--max-ranks-per-token", "3"],
     "--max-ranks-per-token 3 exceeds --ep 2"),
    (["--experts", "4", "--ep", "4", "--dp", "4", "--threads", "4", "--top-k", "3", "--max-ranks-per-token", "1"],
     "--top-k 3 does not fit --max-ranks-per-token 1"),
    (["--experts", "2", "--capacity-factor", "0"], "--capacity-factor"),
    (["--experts", "4", "--ep", "4", "--dp", "2", "--threads", "2"], "--ep 4 does not divide --dp 2"),
    (["--ep", "2", "--dp", "2", "--threads", "2"], "--ep 2 needs --experts E"),
    (["--experts", "2", "--tp", "2", "--sequence-parallel", "--threads", "2"], "with --sequence-parallel"),
    (["--experts", "2", "--compress", "sign", "--dp", "2", "--threads", "2"],
     "--experts 2 does not combine with --compress sign yet"),
    (["--experts", "2", "--precision", "bf16"], "--experts 2 with --precision bf16: routing is a discrete choice"),
    (["--experts", "4", "--moe-every", "100"], "--moe-every 100 with --n-layer 2 places no MoE block"),
    (["--moe-every", "2"], "--moe-every 2 needs --experts E"),
    (["--aux-loss-coef", "0.1"], "--aux-loss-coef 0.1 needs --experts E"),
    (["--aux-loss-scope", "batch"], "--aux-loss-scope batch needs --experts E"),
    (["--experts", "2", "--aux-loss-scope", "token"], "--aux-loss-scope token is not one of sequence, batch"),
    (["--z-loss-coef", "0.1"], "--z-loss-coef 0.1 needs --experts E"),
    (["--experts", "2", "--local-steps", "2", "--dp", "2", "--threads", "2"],
     "--experts 2 does not combine with --local-steps 2 yet"),
    (["--experts", "2", "--cp", "2", "--capacity-factor", "1.0", "--threads", "2"],
     "--capacity-factor 1.0 with --cp 2: a capacity keeps each sequence's earliest tokens first"),
])
def test_bad_expert_flags_are_exit_2_with_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--steps", "1"] + flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith(ERROR) and message in err


def test_a_checkpoint_reshards_to_another_ep_and_to_one_device(tmp_path):
    flags = TINY + ["--experts", "4", "--top-k", "2", "--dtype", "float64", "--steps", "4"]
    straight = main(flags + ["--threads", "4", "--dp", "2", "--ep", "2", "--pp", "2", "--microbatches", "2",
                             "--save", str(tmp_path / "a"), "--save-every", "2"])["losses"]
    for layout in (["--threads", "2", "--dp", "2", "--ep", "1"], ["--threads", "2", "--tp", "2"], [],
                   ["--threads", "4", "--dp", "4", "--ep", "2", "--zero", "1"]):
        resumed = main(flags + layout + ["--resume", str(tmp_path / "a" / "step_000002")])["losses"]
        assert resumed[-2:] == pytest.approx(straight[-2:], rel=1e-9, abs=0), layout


def test_the_loss_free_bias_and_maxvio_are_saved_and_reshard(tmp_path):
    flags = TINY + ["--experts", "4", "--top-k", "2", "--dtype", "float64", "--steps", "5", *DEEPSEEK]
    straight = main(flags + ["--threads", "4", "--dp", "2", "--ep", "2", "--pp", "2", "--microbatches", "2",
                             "--save", str(tmp_path / "a"), "--save-every", "3"])["losses"]
    states = json.loads((tmp_path / "a" / "step_000003" / "manifest.json").read_text())["step_states"]
    assert set(states) == {"blocks.0.mlp", "blocks.1.mlp"} and all(s["max_violation"] >= 0 for s in states.values())
    assert any(max(map(abs, s["expert_bias"])) > 0 for s in states.values())
    for layout in (["--threads", "2", "--tp", "2"], []):
        resumed = main(flags + layout + ["--resume", str(tmp_path / "a" / "step_000003")])["losses"]
        assert resumed[-2:] == pytest.approx(straight[-2:], rel=1e-9, abs=0), layout


def test_the_trace_of_a_pipelined_mixture_of_experts_holds_every_rank(tmp_path):
    trace = tmp_path / "trace.json"
    main(TINY + ["--experts", "4", "--steps", "2", "--threads", "4", "--dp", "2", "--ep", "2", "--pp", "2",
                 "--microbatches", "2", "--trace", str(trace)])
    events = json.loads(trace.read_text())["traceEvents"]
    assert {event["pid"] for event in events if event.get("ph") == "X"} == {0, 1, 2, 3}


def test_a_million_experts_over_the_memory_limit_is_refused_before_building():
    """Under a 2 GiB address-space limit, 10⁵ experts (6.4 GiB of weights, gradients and moments)
    are refused at once, not built for a MemoryError."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, resource.RLIM_INFINITY))
    done = subprocess.run([sys.executable, "-m", "parallel.train", *TINY, "--experts", "100000", "--steps", "1"],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert re.fullmatch(r"python -m parallel.train: error: the model's 428,802,848 parameters need at least 6.39 GiB "
                        r"in each process \(weights, gradients, AdamW moments\), over the 2 GiB it may use: give a "
                        r"smaller model or fewer --experts\n", done.stderr)
