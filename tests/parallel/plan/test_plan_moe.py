"""parallel.plan.moe: the counts equal the real MoE GPT's, and the all-to-all bytes formula
equals what the ep group counts in a training step."""
import numpy as np
import pytest

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh
from parallel.plan.model import dense_param_count, matmul_weight_count
from parallel.plan.moe import (
    active_param_count,
    all_to_all_bytes,
    balanced_all_to_all_bytes,
    expert_bytes_per_rank,
    flops_per_token,
    moe_param_count,
)

SIZES = dict(vocab_size=13, block_size=6, n_layer=3, n_head=2, d_model=8)


@pytest.mark.parametrize("experts, top_k, every", [(0, 2, 1), (4, 2, 1), (3, 1, 2)])
def test_parameter_counts_equal_the_model(experts, top_k, every):
    config = GPTConfig(**SIZES, n_experts=experts, top_k=top_k, moe_every=every)
    model = GPT(config, dtype=np.float64)
    assert moe_param_count(config) == model.num_parameters()
    unused = sum(p.size for name, p in model.named_parameters() if ".experts." in name
                 and int(name.split(".experts.")[1].split(".")[0]) >= top_k)
    assert active_param_count(config) == model.num_parameters() - unused


def test_top_1_of_e_experts_costs_the_dense_flops_plus_the_router():
    dense = GPTConfig(**SIZES)
    moe = GPTConfig(**SIZES, n_experts=4, top_k=1)
    assert flops_per_token(dense) == 6 * matmul_weight_count(dense)
    assert flops_per_token(moe) - flops_per_token(dense) == 6 * 3 * 8 * 4
    assert moe_param_count(moe) > dense_param_count(dense)
    assert expert_bytes_per_rank(moe, ep=2) == 3 * 2 * (2 * 8 * 32 + 32 + 8) * 16


def test_the_all_to_all_formula_equals_the_counted_bytes():
    config = GPTConfig(**SIZES, n_experts=4, top_k=2, capacity_factor=1.0)
    idx = np.random.default_rng(0).integers(0, 13, (8, 6))

    def step():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config, dtype=np.float64), Mesh(4, ep=2))
        model.reset_communication_stats()
        model.train_step(idx, idx)
        me = model.mesh.ep_rank
        formula = sum(all_to_all_bytes(layer.sent.sum() - layer.sent[me], layer.received.sum() - layer.received[me],
                                       8, 8, 4, 2) for layer in model.moe_layers())
        return formula, model.communication_stats()[("ep", "all_to_all")]["bytes"]
    for formula, counted in run_threads(4, step):
        assert formula == counted
    assert balanced_all_to_all_bytes(config, tokens=12, ep=2, itemsize=8) == 3 * (4 * 12 * 8 * 8 + 2 * 8)
