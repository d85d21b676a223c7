"""The sharding search: exact (equal to brute force), and it rediscovers Megatron-LM's split.

Graphs are traced from the real minitensor modules (minitensor.graph.trace), so the search
reads exactly what the model runs; random small graphs come from tests/strategies.py.
"""
from itertools import product

import numpy as np
import pytest
from hypothesis import given
from strategies import operator_graphs, sharding_machines

import minitensor as mt
from minitensor.graph import trace
from minitensor.models import gpt
from minitensor.tensor import Tensor
from parallel.plan.auto import REPLICATED, Machine, auto_shard, evaluate, split
from parallel.plan.auto.plan import is_leaf, node_rules
from parallel.plan.auto.search import leaf_layouts


def brute_force(graph, machine):
    """The least evaluate() seconds over every parameter layout and every op rule."""
    params = [n for n in graph.nodes if n.op == "param"]
    ops = [n for n in graph.nodes if not is_leaf(n)]
    best = float("inf")
    for layouts in product(*(leaf_layouts(p, machine.tp, REPLICATED) for p in params)):
        for chosen in product(*(node_rules(graph, n, machine.tp) for n in ops)):
            plan = evaluate(graph, dict(zip([p.name for p in params], layouts)),
                            dict(zip([n.name for n in ops], chosen)), machine)
            best = min(best, plan.seconds)
    return best


@given(operator_graphs(), sharding_machines)
def test_the_search_finds_the_brute_force_minimum(graph, figures):
    machine = Machine(*figures)
    assert auto_shard(graph, machine).seconds == pytest.approx(brute_force(graph, machine), rel=1e-12, abs=1e-18)


def traced(module, tokens, d_model):
    """The graph of `module` on a (1, tokens, d_model) float64 input."""
    x = Tensor(np.random.default_rng(0).standard_normal((1, tokens, d_model)))
    return trace(module, x).graph


def config(d_model, n_head=8):
    return gpt.GPTConfig(vocab_size=64, block_size=1024, n_layer=1, n_head=n_head, d_model=d_model)


def collectives(plan):
    return sorted((c.direction, c.kind) for c in plan.collectives)


def is_megatron(plan, column, row):
    """Column-parallel weights split on their output features, row-parallel on their input
    features, and one all-reduce each way per row-parallel layer: nothing else moves."""
    return (all(plan.layouts[f"{name}.weight"] == split(0) for name in column)
            and all(plan.layouts[f"{name}.weight"] == split(1) for name in row)
            and collectives(plan) == [("backward", "all-reduce")] * len(row) + [("forward", "all-reduce")] * len(row))


@pytest.mark.parametrize("tp", [2, 4])
def test_mlp_is_split_column_then_row_with_one_all_reduce(tp):
    mt.manual_seed(0)
    graph = traced(gpt.MLP(config(512), dtype=np.float64), 1024, 512)     # medium GPT: b·s = 8·128 tokens
    plan = auto_shard(graph, Machine.from_profile("laptop-cpu", tp))
    assert is_megatron(plan, column=["fc"], row=["proj"]), plan.table(graph)


@pytest.mark.parametrize("tp", [2, 4])
def test_attention_is_split_by_heads_with_one_all_reduce(tp):
    mt.manual_seed(0)
    graph = traced(gpt.SelfAttention(config(512), dtype=np.float64), 128, 512)
    plan = auto_shard(graph, Machine.from_profile("laptop-cpu", tp))
    assert is_megatron(plan, column=["q", "k", "v"], row=["proj"]), plan.table(graph)
    heads = [n.name for n in graph.of_op("Softmax")]
    assert plan.layouts[heads[0]] == split(1)             # (B, heads, T, T): each rank its heads


def test_the_whole_block_is_megatrons_two_all_reduces_each_way():
    mt.manual_seed(0)
    graph = traced(gpt.Block(config(256, n_head=4), dtype=np.float64), 64, 256)
    plan = auto_shard(graph, Machine.from_profile("laptop-cpu", 2))
    assert is_megatron(plan, column=["attn.q", "attn.k", "attn.v", "mlp.fc"], row=["attn.proj", "mlp.proj"])


def test_many_tokens_and_a_narrow_mlp_split_the_tokens_instead():
    """65,536 tokens of width 16: an activation (8 MiB) outweighs the MLP's weights (16 KiB)
    by 500×. Megatron moves the activation four times (an all-reduce each way), splitting the
    tokens moves it twice (gather the output forward, the input's gradient backward) plus an
    all-reduce of the weights' gradients: the search splits the rows, as data parallelism does."""
    mt.manual_seed(0)
    graph = traced(gpt.MLP(config(16, n_head=2), dtype=np.float64), 65536, 16)
    machine = Machine.from_profile("laptop-cpu", 2)
    plan = auto_shard(graph, machine)
    fc, gelu, proj = (n.name for n in graph.nodes if n.op in ("Linear", "Gelu"))
    assert plan.layouts[fc] == plan.layouts[gelu] == split(1)          # (1, tokens, width): tokens split
    assert plan.layouts["fc.weight"] == plan.layouts["proj.weight"] == REPLICATED
    moved = {(c.direction, c.kind, c.value) for c in plan.collectives}
    assert ("forward", "all-gather", graph.outputs[0]) in moved
    assert ("backward", "all-reduce", "fc.weight") in moved and ("backward", "all-reduce", "proj.weight") in moved
    megatron = auto_shard(graph, machine, fixed={"fc.weight": split(0), "proj.weight": split(1)})
    assert is_megatron(megatron, column=["fc"], row=["proj"])
    assert plan.seconds < megatron.seconds


def test_when_a_message_costs_more_than_the_work_it_saves_everything_is_replicated():
    """α = 1 s per message: any collective costs more than the whole MLP's compute (3 × 33
    MFLOP at 12.5 GFLOP/s ≈ 8 ms), so computing everything on every rank is cheapest."""
    mt.manual_seed(0)
    graph = traced(gpt.MLP(config(64), dtype=np.float64), 128, 64)
    laptop = Machine.from_profile("laptop-cpu", 2)
    plan = auto_shard(graph, Machine(2, 1.0, laptop.beta, laptop.rate))
    assert plan.collectives == []
    assert set(plan.layouts.values()) == {REPLICATED}
    assert plan.seconds == pytest.approx(sum(3 * n.flops for n in graph.nodes) / laptop.rate)


def test_machine_rejects_a_bad_group_size():
    with pytest.raises(ValueError, match="tp must be a positive int, got 0"):
        Machine(0, 1e-6, 1e-9, 1e9)
