"""Layout enumeration respects divisibility and memory; the ranking is sane."""
from hypothesis import given
from hypothesis import strategies as st

from parallel.plan import get_config, load_profile, plan

LAPTOP = load_profile("laptop-cpu")


@given(st.sampled_from(["small", "medium"]), st.integers(1, 12), st.sampled_from([8, 12, 32]),
       st.sampled_from([0.002, 0.02, 4.0]))
def test_every_ranked_layout_is_valid_and_fits(name, devices, batch, gib):
    config = get_config(name)
    limit = int(gib * 2**30)
    result = plan(config, devices, batch, LAPTOP, memory_bytes=limit)
    times = [est.time["total"] for est in result.ranked]
    # ties are broken by simplicity, so equal times may differ in the last bits
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:]))
    for est in result.ranked:
        layout = est.layout
        assert layout.dp * layout.tp * layout.pp == devices
        assert config.n_head % layout.tp == 0 and (4 * config.d_model) % layout.tp == 0
        assert layout.tp <= LAPTOP["devices_per_node"]
        assert layout.pp <= config.n_layer
        assert batch % (layout.dp * layout.micro_batches) == 0
        assert est.memory["total"] <= limit
    if result.smallest_rejected is not None:
        assert result.smallest_rejected.memory["total"] > limit
        assert any(why.startswith("candidates out of memory") for why in result.rejected)


def test_rejections_name_the_rule():
    result = plan(get_config("medium"), 24, 32, LAPTOP)
    reasons = " ".join(result.rejected)
    assert "n_head=8 not divisible by tp" in reasons
    assert "tp > 4 devices per node" in reasons
    assert "pp > n_layer=4" in reasons
    assert "batch=32 not divisible by dp" in reasons


def test_nothing_fits_in_a_tiny_memory():
    result = plan(get_config("medium"), 4, 32, LAPTOP, memory_bytes=2**20)
    assert result.ranked == []
    assert sum(result.rejected.values()) > 0


def test_tiny_model_on_a_laptop_prefers_data_parallel():
    result = plan(get_config("small"), 4, 16, LAPTOP)
    assert (result.ranked[0].layout.dp, result.ranked[0].layout.tp,
            result.ranked[0].layout.pp) == (4, 1, 1)


def test_gpt3_on_1024_a100s_uses_tp_within_a_node_and_pipelining():
    result = plan(get_config("gpt3-175b"), 1024, 1536, load_profile("a100-80gb"), dtype="mixed")
    top = result.ranked[:10]
    assert len(top) == 10
    assert all(est.layout.tp <= 8 and est.layout.pp > 1 for est in top)
    # 175B never fits unpipelined, unless ZeRO-2/3 shard its gradients and AdamW states (12 of the
    # 16 bytes per parameter) over the dp ranks too (Rajbhandari et al. 2020)
    assert all(est.layout.pp > 1 for est in result.ranked if est.layout.zero < 2)
    assert any(est.layout.pp == 1 for est in result.ranked if est.layout.zero >= 2)


def test_inter_node_tp_only_when_allowed():
    config = get_config("medium")                     # 8 heads; a laptop node has 4 ranks
    assert max(e.layout.tp for e in plan(config, 16, 32, LAPTOP).ranked) == 4
    allowed = plan(config, 16, 32, LAPTOP, allow_inter_node_tp=True)
    assert max(e.layout.tp for e in allowed.ranked) == 8
