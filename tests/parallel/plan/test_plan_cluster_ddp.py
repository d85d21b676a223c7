"""The dp all-reduce of the GPU-cluster model (parallel.plan.cluster) under Megatron-LM's two DDPs: its own
("local", after the backward) and PyTorch's ("torch", bucketed, hidden behind the last micro-batch's backward),
which the 2021 paper's p = 1 runs used (examples/sc21/run_table_1.sh)."""
import json

import pytest
from published_argv import published_argv

from parallel.alpha_beta import ring_all_reduce
from parallel.plan import load_profile
from parallel.plan.__main__ import main
from parallel.plan.cluster import group_link, step
from parallel.plan.cluster_search import best_steps
from parallel.plan.published import TABLE_1, row_config

A100 = load_profile("a100-80gb")
GPU = A100["cluster"]


def test_torch_ddp_hides_the_dp_all_reduce_behind_the_last_backward_but_not_the_embeddings():
    config = row_config(TABLE_1[0])                                      # 1.7B, dp 32, one micro-batch
    local, torch = (step(config, A100, 512, 1, 1, 32, 16, ddp=ddp) for ddp in ("local", "torch"))
    embedding = ring_all_reduce(32, 51200 * 2304 * 2, *group_link(GPU, 1, 32))
    assert torch.seconds["dp"] == pytest.approx(embedding) and local.seconds["dp"] > 10 * embedding
    assert local.seconds["step"] - torch.seconds["step"] == pytest.approx(local.seconds["dp"] - embedding)
    with pytest.raises(ValueError, match="torch DDP needs pp = 1"):
        step(row_config(TABLE_1[4]), A100, 1536, 8, 2, 32, 4, ddp="torch")


def test_the_hidden_part_is_bounded_by_the_last_micro_batchs_backward():
    config = row_config(TABLE_1[3])                                      # 18.4B, t 8, dp 32, b 8: 4 micro-batches
    local, torch = (step(config, A100, 1024, 8, 1, 32, 8, ddp=ddp) for ddp in ("local", "torch"))
    hidden = local.seconds["dp"] - torch.seconds["dp"]
    per_micro_batch = local.seconds["compute"] / 4 + local.seconds["tp"] / 4
    assert 0 < hidden <= 0.75 * per_micro_batch


def test_torch_ddp_holds_a_second_copy_of_the_gradients_in_its_buckets():
    """PyTorch's DDP copies each gradient into its bucket (gradient_as_bucket_view is off by default)."""
    local, torch = (step(row_config(TABLE_1[0]), A100, 512, 1, 1, 32, 16, ddp=ddp) for ddp in ("local", "torch"))
    assert "ddp_buckets" not in local.memory and torch.memory["ddp_buckets"] == local.memory["grads"]
    assert torch.memory["total"] - local.memory["total"] == local.memory["grads"]


def test_the_search_tries_both_ddps_where_both_run_and_only_local_with_pipelining():
    config = row_config(TABLE_1[3])                                      # 18.4B on 256 GPUs
    steps = best_steps(config, A100, 256, 1024, tp=8, b=8, v=1)
    kinds = {(st.pp, st.ddp) for st in steps}
    assert {(1, "local"), (1, "torch")} <= kinds and all(ddp == "local" for pp, ddp in kinds if pp > 1)
    pp1 = [st for st in steps if st.pp == 1]
    assert pp1[0].ddp == "torch" and pp1[0].seconds["step"] < next(st for st in pp1 if st.ddp == "local").seconds["step"]
    only = best_steps(config, A100, 256, 1024, tp=8, pp=1, b=8, v=1, ddp="local")
    assert [st.ddp for st in only] == ["local"]


def test_the_cli_picks_torch_ddp_without_pipelining_and_reports_it(capsys):
    """Without ddp= the search takes the faster DDP: PyTorch's where p = 1 (1.7B row of Table 1, dp 32)."""
    gpt_1b7 = published_argv(TABLE_1[0])
    outs = {}
    for extra in ("", ",ddp=local"):
        assert main([*gpt_1b7, "--layout", f"tp=1,pp=1,dp=32,m=16{extra}", "--json"]) == 0
        outs[extra] = json.loads(capsys.readouterr().out)
    assert outs[""]["ddp"] == "torch" and outs[",ddp=local"]["ddp"] == "local"
    assert outs[""]["step_seconds"] < outs[",ddp=local"]["step_seconds"]
