"""`python -m parallel.plan ... --device a100-80gb --top K --json`: the K best layouts of a GPU cluster as a
JSON list (issue 34's stable CLI), each (tp, pp, dp) once at its best micro-batch, interleaving and DDP, with
the keys of the one-layout JSON."""
import json

import pytest
from published_argv import published_argv

from parallel.plan.__main__ import main
from parallel.plan.published import TABLE_1

GPT_18B = published_argv(TABLE_1[3])                                           # Table 1's 18.4B row


def test_top_k_json_lists_the_k_fastest_layouts_each_once_with_the_stable_keys(capsys):
    assert main([*GPT_18B, "--top", "4", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)
    assert len(top) == 4 and len({(x["tp"], x["pp"], x["dp"]) for x in top}) == 4
    for x in top:
        assert {"tp", "pp", "dp", "step_seconds", "tflops_per_device", "memory_bytes_per_device", "ddp"} <= set(x)
        assert x["tp"] * x["pp"] * x["dp"] == 256 and x["fits"]
    assert [x["step_seconds"] for x in top] == sorted(x["step_seconds"] for x in top)
    first = top[0]                                    # the same step --layout costs for its (tp, pp, dp)
    assert main([*GPT_18B, "--layout", f"tp={first['tp']},pp={first['pp']},dp={first['dp']}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_seconds"] == pytest.approx(first["step_seconds"], rel=1e-12)


@pytest.mark.parametrize("argv, message", [
    (published_argv(TABLE_1[3], device="laptop-cpu"), "--json: device 'laptop-cpu' has no 'cluster'"),
    (published_argv(TABLE_1[3], with_batch=False), "--json needs --batch")])
def test_top_k_json_refuses_a_device_without_cluster_figures_and_a_missing_batch(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--top", "3", "--json"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
