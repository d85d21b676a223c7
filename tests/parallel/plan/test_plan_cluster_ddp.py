"""The dp all-reduce of the GPU-cluster model (parallel.plan.cluster) under Megatron-LM's two DDPs: its own
("local", after the backward) and PyTorch's ("torch", bucketed, hidden behind the last micro-batch's backward),
which the 2021 paper's p = 1 runs used (examples/sc21/run_table_1.sh)."""
import pytest

from parallel.alpha_beta import ring_all_reduce
from parallel.plan import load_profile
from parallel.plan.cluster import group_link, step
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
