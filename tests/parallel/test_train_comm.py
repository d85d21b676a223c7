"""`python -m parallel.train`'s communication flags: --link, --compress, --local-steps (threads
backend, and one run under mpiexec that must give the threads run's losses)."""
import re

import numpy as np
import pytest
from mpi_launch import requires_mpiexec, run_mpi

from parallel.train import main

TINY = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--log-every", "1"]


def flags(*extra, steps=3):
    return TINY + ["--steps", str(steps), *extra]


@pytest.mark.parametrize("extra, message", [
    (["--threads", "2", "--dp", "2", "--compress", "topk:0.1", "--zero"],
     "--compress topk:0.1 acts on the dp all-reduce of whole replicas, which --zero 1 replaces"),
    (["--threads", "2", "--dp", "2", "--compress", "sign", "--zero", "3"], "which --zero 3 replaces"),
    (["--threads", "2", "--dp", "2", "--local-steps", "4", "--zero"], "--local-steps 4 acts on the dp all-reduce"),
    (["--threads", "4", "--dp", "2", "--cp", "2", "--digits", "2", "--local-steps", "2"],
     "--local-steps 2 with --cp 2: the cp ranks of a replica hold parts of one gradient"),
    (["--compress", "sign"], "--compress sign acts on the communication over dp, but --dp is 1"),
    (["--threads", "2", "--dp", "2", "--compress", "powersgd:2", "--check"],
     "--compress powersgd:2 changes the mathematics on purpose, so --check's single-device reference"),
    (["--threads", "2", "--dp", "2", "--outer-lr", "0.5"], "--outer-lr 0.5 set DiLoCo's outer optimizer, "
                                                           "which needs --local-steps H"),
    (["--threads", "2", "--dp", "2", "--local-steps", "2", "--outer-momentum", "1"], "--outer-momentum=1.0 must be"),
    (["--compress", "gzip"], "--compress 'gzip' is not one of none, powersgd:R, topk:RATIO, sign"),
    (["--link", "wifi"], "--link 'wifi' is neither a link name (loopback, 100mbe, 1gbe, 10gbe, ib-hdr, nvlink, veth-100mbit)"),
])
def test_senseless_combinations_name_both_flags(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(flags(*extra))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, kind", [(["--compress", "powersgd:2"], "all_reduce"),
                                         (["--compress", "topk:0.1"], "all_gather"),
                                         (["--compress", "sign"], "all_gather"),
                                         (["--local-steps", "2"], "all_reduce")])
def test_each_method_trains_and_reports_its_communication(extra, kind, capsys):
    result = main(flags("--threads", "2", "--dp", "2", "--link", "1gbe", *extra))
    assert all(np.isfinite(result["losses"]))
    out = capsys.readouterr().out
    assert re.search(rf"dp {kind} +modelled [0-9.]+ s  measured [0-9.]+ s  exposed [0-9.]+ s", out), out
    assert "exposed communication:" in out


def test_local_steps_reduce_only_every_h_steps(capsys):
    main(flags("--threads", "2", "--dp", "2", "--local-steps", "2", steps=3))  # the last step syncs nothing
    table = capsys.readouterr().out.split("communication per step")[1]
    assert re.search(r"dp all_reduce +1 calls +0\.000 MB", table), table  # only the loss's 8 bytes


@requires_mpiexec
def test_compression_on_a_link_under_mpiexec_gives_the_threads_losses():
    extra = ["--dp", "2", "--compress", "powersgd:2", "--link", "10gbe", "--dtype", "float64"]
    threads = main(flags("--threads", "2", *extra))["losses"]
    result = run_mpi(2, ["-m", "parallel.train", *flags(*extra)], timeout=120)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", result.stdout)]
    np.testing.assert_allclose(losses, threads, rtol=1e-4)  # the progress line prints 4 decimals
    assert "compression powersgd:2" in result.stdout


def test_the_trace_draws_each_dp_bucket_against_backward(tmp_path):
    import json

    from parallel.comm.link import parse_link
    trace = tmp_path / "trace.json"
    main(flags("--threads", "2", "--dp", "2", "--link", "1gbe", "--trace", str(trace), steps=2))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        buckets = [e for e in events if e["pid"] == rank and e["cat"] == "dp_bucket"]
        backward = [e for e in events if e["pid"] == rank and e["cat"] == "backward"]
        assert buckets and backward
        # HybridGPT reduces over dp after the pipeline's last backward; each span lasts at least the
        # link's latency part of an all-reduce on 2 ranks.
        assert min(b["ts"] for b in buckets) >= max(e["ts"] + e["dur"] for e in backward)
        assert all(b["dur"] * 1e-6 >= 2 * parse_link("1gbe").alpha for b in buckets)  # 2(n−1)α at least


@pytest.mark.parametrize("method", ["powersgd:2", "topk:0.1"])
def test_a_resumed_run_continues_the_compressor_state_and_the_same_losses(method, tmp_path):
    extra = ["--threads", "2", "--dp", "2", "--dtype", "float64", "--compress", method]
    whole = main(flags(*extra, "--save", str(tmp_path), "--save-every", "2", steps=4))["losses"]
    resumed = main(flags(*extra, "--resume", str(tmp_path / "step_000002"), steps=4))["losses"]
    np.testing.assert_allclose(resumed, whole[2:], rtol=1e-12)


def test_local_sgd_resumed_between_outer_steps_is_bitwise_the_uninterrupted_run(tmp_path, capsys):
    """H = 3, saved after step 4: one outer step (momentum) behind, one inner step into the next
    period, so the replicas differ; each must get its own parameters and AdamW moments back."""
    extra = ["--threads", "2", "--dp", "2", "--dtype", "float64", "--local-steps", "3"]
    whole = main(flags(*extra, "--save", str(tmp_path), "--save-every", "4", steps=7))
    resumed = main(flags(*extra, "--resume", str(tmp_path / "step_000004"), steps=7))
    assert resumed["losses"] == whole["losses"][4:] and resumed["metric"] == whole["metric"]  # bitwise
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # a good checkpoint is not overwritten by a fresh run
        main(flags(*extra, "--save", str(tmp_path), steps=7))
    assert exit_info.value.code == 2 and "already holds checkpoints (step_000004, step_000007)" in \
        capsys.readouterr().err


def test_async_staleness_zero_is_the_synchronous_run_of_the_same_flags(capsys):
    extra = ["--dp", "2", "--dtype", "float64"]
    synchronous = main(flags("--threads", "2", *extra, steps=4))["losses"]
    server = main(flags("--threads", "3", *extra, "--async-staleness", "0", steps=4))
    np.testing.assert_allclose(server["losses"], synchronous, rtol=1e-9)
    stale = main(flags("--threads", "3", *extra, "--async-staleness", "2", steps=4))["losses"]
    assert stale[0] == pytest.approx(synchronous[0], rel=1e-12) and not np.allclose(stale, synchronous, rtol=1e-9)
    assert "parameter server: rank 0 holds the parameters and the optimizer; ranks 1..2 are workers" in \
        capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--threads", "2", "--dp", "2", "--async-staleness", "1"],
     "--dp 2 x --tp 1 x --pp 1 + 1 server = 3 ranks, but the world has 2"),
    (["--threads", "5", "--dp", "2", "--tp", "2", "--async-staleness", "1"],
     "--async-staleness 1 trains the dense model on --dp workers around one server; it does not combine with --tp 2"),
    (["--threads", "3", "--dp", "2", "--async-staleness", "1", "--compress", "sign"], "does not combine with "
                                                                                      "--compress sign"),
    *[(["--threads", "3", "--dp", "2", "--async-staleness", "1", *ignored], f"does not combine with {ignored[0]}")
      for ignored in (["--zero", "1"], ["--recompute-activations"], ["--schedule", "gpipe"],
                      ["--eval-every", "1"])],
])
def test_async_staleness_errors_name_both_flags(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(flags(*extra))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
