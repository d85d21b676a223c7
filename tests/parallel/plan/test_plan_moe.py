"""parallel.plan with a mixture of experts: the counts equal the real MoE GPT's, the bytes per
rank what HybridGPT holds under ep, tp and pp, the all-to-all bytes formula what the ep group
counts in a training step, the fan-out estimate (uniform routing, capped by the device limit) a
real step's; the search tries every ep and the step time charges the all-to-alls."""
from itertools import combinations

import numpy as np
import pytest

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from parallel.comm import run_threads
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh
from parallel.plan import param_bytes_per_rank, plan
from parallel.plan.cost import estimate, link
from parallel.plan.flops import block_flops
from parallel.plan.layout import Layout
from parallel.plan.model import dense_param_count, is_moe_block, matmul_weight_count
from parallel.plan.moe import (
    active_param_count,
    all_to_all_bytes,
    all_to_all_seconds,
    balanced_all_to_all_bytes,
    balancing_seconds,
    expert_bytes_per_rank,
    flops_per_token,
    ranks_per_token,
)
from parallel.plan.profiles import load_profile

SIZES = dict(vocab_size=13, block_size=6, n_layer=3, n_head=2, d_model=8)


@pytest.mark.parametrize("experts, top_k, every, fine", [(0, 2, 1, {}), (4, 2, 1, {}), (3, 1, 2, {}),
                                                         (8, 2, 1, dict(expert_hidden=8, shared_experts=2))])
def test_parameter_counts_equal_the_model(experts, top_k, every, fine):
    config = GPTConfig(**SIZES, n_experts=experts, top_k=top_k, moe_every=every, **fine)
    model = GPT(config, dtype=np.float64)
    assert dense_param_count(config) == model.num_parameters()
    unused = sum(p.size for name, p in model.named_parameters() if ".experts." in name
                 and int(name.split(".experts.")[1].split(".")[0]) >= top_k)
    assert active_param_count(config) == model.num_parameters() - unused


def test_top_1_of_e_experts_costs_the_dense_flops_plus_the_router():
    dense = GPTConfig(**SIZES)
    moe = GPTConfig(**SIZES, n_experts=4, top_k=1)
    assert flops_per_token(dense) == 6 * matmul_weight_count(dense)
    assert flops_per_token(moe) - flops_per_token(dense) == 6 * 3 * 8 * 4
    assert dense_param_count(moe) > dense_param_count(dense)
    assert expert_bytes_per_rank(moe, ep=2) == 3 * 2 * (2 * 8 * 32 + 32 + 8) * 16
    fine = GPTConfig(**SIZES, n_experts=8, top_k=2, expert_hidden=16, shared_experts=1)  # 3 experts of 16 a token
    assert flops_per_token(fine) - flops_per_token(moe) == 6 * 3 * (8 * 8 + 3 * 2 * 8 * 16 - 4 * 8 - 2 * 8 * 32)


def test_the_all_to_all_formula_equals_the_counted_bytes():
    config = GPTConfig(**SIZES, n_experts=4, top_k=2, capacity_factor=1.0)
    idx = np.random.default_rng(0).integers(0, 13, (8, 6))

    def step():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config, dtype=np.float64), Mesh(4, ep=2))
        model.reset_communication_stats()
        model.train_step(idx, idx)
        me = model.mesh.ep_rank
        dispatchers = [layer.dispatcher for layer in model.moe_layers()]
        formula = sum(all_to_all_bytes(d.sent.sum() - d.sent[me], d.received.sum() - d.received[me], 8, 8, 4, 2)
                      for d in dispatchers)
        return formula, model.communication_stats()[("ep", "all_to_all")]["bytes"]
    for formula, counted in run_threads(4, step):
        assert formula == counted
    # top-2 of 4 experts on 2 ranks: a token misses a rank with probability C(2, 2)/C(4, 2) = 1/6, so it
    # reaches 5/3 ranks, half of them elsewhere: 12 tokens send ⌈10⌉ rows of d + E/ep = 10 values
    assert balanced_all_to_all_bytes(config, tokens=12, ep=2, itemsize=8) == 3 * (2 * 10 * (2 * 8 + 2) * 8 + 8)


MOE = GPTConfig(vocab_size=13, block_size=6, n_layer=2, n_head=2, d_model=8, n_experts=4, top_k=2)
DEEPSEEK = GPTConfig(vocab_size=13, block_size=6, n_layer=2, n_head=2, d_model=8, n_experts=4, top_k=2, expert_hidden=8,
                     shared_experts=2, router_score="sigmoid")


@pytest.mark.parametrize("dp, tp, pp, ep, zero, config", [
    (2, 1, 1, 2, 0, MOE), (4, 1, 1, 2, 0, MOE), (2, 2, 1, 2, 0, MOE), (2, 1, 2, 2, 0, MOE), (1, 2, 2, 1, 0, MOE),
    (4, 1, 1, 2, 1, MOE), (2, 1, 2, 1, 1, MOE), (2, 2, 1, 2, 0, DEEPSEEK), (4, 1, 1, 2, 1, DEEPSEEK)])
def test_the_planners_bytes_per_rank_are_what_hybrid_gpt_holds_with_experts(dp, tp, pp, ep, zero, config):
    """Parameters, gradients and AdamW's state (ZeRO-1: the experts' cut over edp) on every rank."""
    def held():
        model = HybridGPT(GPT(config, dtype=np.float32), Mesh(dp, tp, pp, ep=ep), microbatches=pp, zero=zero)
        model.configure_optimizer()
        model.train_step(*[np.random.default_rng(0).integers(0, 13, (4 * dp, 6))] * 2)
        model.finish_grad_sync()
        model.optimizer.step()
        measured = {kind: model.memory_bytes()[kind] for kind in ("params", "grads", "optim")}
        return measured, param_bytes_per_rank(config, dp, tp, pp, model.mesh.coords, "float32", zero, ep=ep)
    for measured, planned in run_threads(dp * tp * pp, held):
        assert measured == planned


def test_the_search_tries_every_ep_and_splits_experts_that_do_not_fit_on_one_rank():
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, d_model=64, n_experts=8, top_k=2)
    whole = param_bytes_per_rank(config, 4, 1, 1)
    quarter = param_bytes_per_rank(config, 4, 1, 1, ep=4)
    limit = (sum(whole.values()) + sum(quarter.values())) / 2  # the experts fit only when split
    result = plan(config, devices=4, batch=8, profile="laptop-cpu", memory_bytes=limit)
    # without tp, pp or ZeRO-1 (which shards the moments), only ep splits the model enough
    pure_dp = [est.layout.ep for est in result.ranked if est.layout.dp == 4 and not est.layout.zero]
    assert 4 in pure_dp and 1 not in pure_dp
    assert all(est.comm["ep"] > 0 for est in result.ranked if est.layout.ep > 1)
    assert not any(est.layout.zero > 1 or est.layout.sequence_parallel for est in result.ranked)
    roomy = plan(config, devices=4, batch=8, profile="laptop-cpu", memory_bytes=2**40)
    assert {est.layout.ep for est in roomy.ranked} == {1, 2, 4}


def test_the_step_time_charges_the_all_to_alls_and_the_experts_whole_on_every_tp_rank():
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, d_model=64, n_experts=4, top_k=1)
    dense = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, d_model=64)
    tokens, passes = 4 * 32, 3
    # top-1 of 4 experts on tp = 2: the router (2·h·E) and one whole expert (2·8·h²) in place of
    # the dense MLP's half (2·8·h²/2): the experts are not split over tp
    moe_block = block_flops(config, is_moe_block(config, 0), tokens, 2, passes)
    dense_block = block_flops(dense, is_moe_block(dense, 0), tokens, 2, passes)
    assert moe_block - dense_block == pytest.approx(passes * (2 * 64 * 4 + 2 * 8 * 64 * 64 / 2) * tokens)
    one, split = (estimate(config, Layout(dp=2, ep=ep), batch=8, profile="laptop-cpu") for ep in (1, 2))
    assert "ep" not in one.comm and split.comm["ep"] == pytest.approx(
        2 * all_to_all_seconds(config, tokens, 2, 4, *link(load_profile("laptop-cpu"), 1, 2)[1:]))
    with pytest.raises(ValueError, match="sequence parallelism is not composed with experts"):
        estimate(config, Layout(tp=2, sequence_parallel=True), batch=8, profile="laptop-cpu")


def test_the_plan_command_takes_fine_grained_and_shared_experts(capsys):
    from parallel.plan.__main__ import main
    main(["--n-layer", "2", "--d-model", "64", "--n-head", "4", "--vocab", "64", "--seq", "32", "--experts", "8",
          "--expert-hidden", "64", "--shared-experts", "1", "--devices", "4", "--batch", "8", "--top", "1"])
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, d_model=64, n_experts=8, expert_hidden=64,
                       shared_experts=1)
    out = capsys.readouterr().out
    assert f"= {dense_param_count(config):,} parameters ({active_param_count(config):,} active per token)" in out


@pytest.mark.parametrize("scope, dp, cp, m, calls", [("batch", 2, 1, 2, 2 * 3), ("batch", 2, 2, 1, 3),
                                                      ("sequence", 2, 1, 2, 0), ("sequence", 1, 2, 2, 2 * 3)])
def test_the_balancing_all_reduce_is_one_per_moe_layer_and_micro_batch(scope, dp, cp, m, calls):
    """Counted in a training step of HybridGPT (3 MoE layers): the shares f all-reduced over dp × cp
    (batch scope: E values) or cp (sequence scope: E per sequence), as moe.balancing_seconds charges."""
    config = GPTConfig(**SIZES, n_experts=4, top_k=2, aux_loss_scope=scope)
    idx = np.random.default_rng(0).integers(0, 13, (4, 4))

    def step():
        model = HybridGPT(GPT(config, dtype=np.float64), Mesh(dp, cp=cp), microbatches=m)
        model.reset_communication_stats()
        model.train_step(idx, idx)  # before the gradient sync: the balancing all-reduces and the mean loss's
        stats = model.communication_stats()
        return {group: (count["calls"], count["elements"]) for (group, kind), count in stats.items()
                if kind == "all_reduce"}
    sequences, dp_cp = 4 // (dp * m), "dp_cp" if cp > 1 else "dp"
    # beside them: the mean loss over dp × cp, and under cp each micro-batch's count of its tokens
    want = {dp_cp: np.array([1, 1]), **({"cp": np.array([m, m])} if cp > 1 else {})}
    group, values = (dp_cp, 4) if scope == "batch" else ("cp", sequences * 4)
    if calls:
        want[group] = want[group] + [calls, calls * values]
    for counted in run_threads(dp * cp, step):
        assert counted == {name: tuple(pair) for name, pair in want.items()}
    profile = load_profile("laptop-cpu")
    one = estimate(config, Layout(dp=dp, cp=cp, micro_batches=m), batch=4, profile=profile)
    alpha, beta = link(profile, 1, dp * cp if scope == "batch" else cp)[1:]
    ranks = dp * cp if scope == "batch" else cp
    charged = m * 3 * balancing_seconds(config, sequences, ranks, 4, alpha, beta) if calls else 0.0
    assert one.comm.get("ep", 0.0) == pytest.approx(charged, rel=1e-12)


@pytest.mark.parametrize("flags, message", [
    (["--experts", "4", "--moe-every", "100"], "--moe-every 100 with --n-layer 2 places no MoE block"),
    (["--top-k", "1"], "--top-k needs --experts E"),
    (["--moe-every", "2"], "--moe-every needs --experts E"),
    (["--max-ranks-per-token", "2"], "--max-ranks-per-token needs --experts E"),
    (["--experts", "4", "--dtype", "fp16"], "--experts 4 with --precision fp16: routing is a discrete choice"),
    (["--experts", "4", "--local-steps", "4", "--devices", "4"], "--experts 4 does not combine with --local-steps 4"),
    (["--experts", "4", "--compress", "sign", "--devices", "4"], "--experts 4 does not combine with --compress sign"),
])
def test_the_planner_refuses_what_the_trainer_refuses_for_experts(flags, message, capsys):
    """One source (parallel.expert_parallel.composes): no ranked table of layouts the trainer would not run."""
    from parallel.plan.__main__ import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", "small", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err[-1].startswith("python -m parallel.plan: error: ") and message in err[-1]


@pytest.mark.parametrize("experts, top_k, ep", [(8, 4, 4), (16, 4, 4), (6, 2, 3), (4, 1, 2)])
def test_the_uniform_fan_out_is_the_mean_of_distinct_ranks_over_every_choice_of_k_experts(experts, top_k, ep):
    config = GPTConfig(**SIZES, n_experts=experts, top_k=top_k)
    choices = list(combinations(range(experts), top_k))
    mean = np.mean([len({e // (experts // ep) for e in chosen}) for chosen in choices])
    assert ranks_per_token(config, ep) == pytest.approx(mean, rel=1e-12)
    assert ranks_per_token(config, ep, max_ranks=1) == 1 and ranks_per_token(config, ep) <= min(top_k, ep)


@pytest.mark.parametrize("limit", [None, 2, 1])
def test_the_planned_all_to_all_bytes_are_within_a_tenth_of_a_step_with_a_random_router(limit):
    """Random tokens through a random router route nearly uniformly: the mean rank's counted bytes of
    one training step (E = 16, top-4, ep = 4, at most `limit` ranks per token) against the planner's."""
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, d_model=8, n_experts=16, top_k=4,
                       expert_hidden=4, expert_groups=4, max_groups_per_token=limit)
    idx = np.random.default_rng(0).integers(0, 64, (32, 16))

    def step():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config, dtype=np.float64), Mesh(4, ep=4))
        model.reset_communication_stats()
        model.train_step(idx, idx)
        return model.communication_stats()[("ep", "all_to_all")]["bytes"]
    counted = np.mean(run_threads(4, step))
    planned = balanced_all_to_all_bytes(config, tokens=8 * 16, ep=4, itemsize=8, max_ranks=limit)
    assert abs(counted / planned - 1) < 0.1, (counted, planned)


def test_the_search_under_a_device_limit_tries_only_the_ep_that_hold_top_k_on_m_ranks():
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, d_model=64, n_experts=8, top_k=4)
    limited = plan(config, devices=4, batch=8, profile="laptop-cpu", memory_bytes=2**40, max_ranks=1)
    assert {est.layout.ep for est in limited.ranked} == {1, 2}  # ep = 4 holds 2 experts a rank: top-4 needs 2 ranks
    free, capped = (estimate(config, Layout(dp=4, ep=2, max_ranks=m), batch=8, profile="laptop-cpu") for m in (None, 1))
    assert capped.comm["ep"] < free.comm["ep"]


def test_the_plan_command_takes_the_device_limit(capsys):
    from parallel.plan.__main__ import main
    flags = ["--n-layer", "2", "--d-model", "64", "--n-head", "4", "--vocab", "64", "--seq", "32", "--experts", "8",
             "--top-k", "4", "--devices", "4", "--batch", "8", "--top", "100", "--mem-per-device", "1TB"]
    main(flags)
    assert "ep4" in capsys.readouterr().out
    main(flags + ["--max-ranks-per-token", "1"])
    out = capsys.readouterr().out
    assert "ep2" in out and "ep4" not in out  # 2 experts a rank at ep = 4 cannot hold a token's 4 on one
