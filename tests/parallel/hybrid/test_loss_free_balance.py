"""Loss-free balancing under HybridGPT: after N optimizer steps each MoE layer's routing bias is
bitwise the same on every rank, in the gathered single-device view, and equal to one device's (loads summed over dp × cp, once over
tp, once under recomputation; a pipeline stage without a MoE layer has nothing to update)."""
import numpy as np
import pytest

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import HybridGPT, Mesh, run_threads

CONFIG = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=4, d_model=16, n_experts=4, top_k=2,
                   router_score="sigmoid", shared_experts=1, expert_hidden=8, expert_bias_rate=0.05)
STEPS, LR = 3, 1e-2


def batches():
    rng = np.random.default_rng(0)
    return [(lambda idx: (idx, np.roll(idx, -1, axis=1)))(rng.integers(0, 12, (8, 8))) for _ in range(STEPS)]


def one_device(config):
    mt.manual_seed(0)
    model = GPT(config, dtype=np.float64)
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    updates = [u for m in model.modules() for u in m.step_updates()]
    for idx, targets in batches():
        model.zero_grad()
        model(idx, targets)[1].backward()
        optimizer.step()
        for update in updates:
            update.after_step()
    return {f"blocks.{i}.mlp": b.mlp.bias.value.copy() for i, b in enumerate(model.blocks) if config.is_moe(i)}


def on_ranks(config, dp, tp=1, pp=1, cp=1, ep=1, **layout):
    def rank():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config, dtype=np.float64), Mesh(dp, tp, pp, cp, ep=ep), **layout)
        model.configure_optimizer(lr=LR, weight_decay=0.01)
        for idx, targets in batches():
            model.train_step(idx, targets)
            model.optimizer_step()
        dense = model.dense_gpt()  # evaluation's single-device view routes with the same bias
        return ({name: update.value.copy() for name, update in model.step_updates},
                {f"blocks.{i}.mlp": b.mlp.bias.value.copy() for i, b in enumerate(dense.blocks) if config.is_moe(i)})
    return run_threads(dp * tp * pp * cp, rank)


@pytest.mark.parametrize("config, layout", [
    (CONFIG, dict(dp=2, ep=2, cp=2, zero=2)),
    (CONFIG, dict(dp=2, ep=2, tp=2, zero=3)),
    (GPTConfig(**{**CONFIG.__dict__, "moe_every": 2}),  # stage 0 holds block 0, which is dense
     dict(dp=2, ep=2, pp=2, microbatches=2, recompute_activations=True, zero=1))])
def test_the_bias_is_bitwise_one_devices_on_every_rank(config, layout):
    want = one_device(config)
    assert any(np.abs(bias).max() > 0 for bias in want.values())
    per_rank = on_ranks(config, **layout)
    assert set().union(*(own for own, _ in per_rank)) == set(want)  # every MoE layer lives on some rank
    for own, dense in per_rank:
        assert dense.keys() == want.keys()
        for name, bias in [*own.items(), *dense.items()]:
            assert bias.dtype == np.float32 and bias.tobytes() == want[name].tobytes(), (name, bias, want[name])
