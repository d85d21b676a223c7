"""`python -m parallel.plan ... --device a100-80gb --top K --json`: the K best layouts of a GPU cluster as a
JSON list (issue 34's stable CLI), each (tp, pp, dp) once at its best micro-batch, interleaving and DDP, with
the keys of the one-layout JSON."""
import json

import pytest

from parallel.plan.__main__ import main

GPT_18B = ["--n-layer", "40", "--d-model", "6144", "--n-head", "48", "--vocab", "51200", "--seq", "2048",
           "--batch", "1024", "--devices", "256", "--device", "a100-80gb"]    # Table 1's 18.4B row


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


@pytest.mark.parametrize("argv, message", [(["--device", "laptop-cpu"], "--json: device 'laptop-cpu' has no 'cluster'"),
                                           (["--batch", None], "--json needs --batch")])
def test_top_k_json_refuses_a_device_without_cluster_figures_and_a_missing_batch(argv, message, capsys):
    args = list(GPT_18B)
    flag = argv[0]
    at = args.index(flag)
    if argv[1] is None:
        del args[at:at + 2]
    else:
        args[at + 1] = argv[1]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--top", "3", "--json"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
