"""minitensor.graph: DOT export and the FLOPs / saved-memory table of a graph."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
from minitensor import graph
from minitensor.nn import functional as F


@given(batch=st.integers(1, 3), m=st.integers(1, 5), k=st.integers(1, 5), n=st.integers(1, 5))
def test_matmul_and_linear_cost_2mnk_per_batch(batch, m, k, n):
    a = mt.tensor(np.ones((batch, m, k)), requires_grad=True)
    w = mt.tensor(np.ones((n, k)), requires_grad=True)
    (row,) = graph.ops_table(a @ w.T)[-1:]
    assert row == {"op": "MatMul", "shape": (batch, m, n), "flops": 2 * batch * m * n * k,
                   "saved_bytes": 8 * (batch * m * k + n * k)}
    assert graph.ops_table(F.linear(a, w))[-1]["flops"] == 2 * batch * m * n * k


def test_elementwise_ops_cost_one_per_element_and_moves_are_free():
    x = mt.tensor(np.ones((3, 4)), requires_grad=True)
    y = (x * 2.0).exp().reshape(4, 3).T.sum()
    rows = graph.ops_table(y)
    assert [(r["op"], r["flops"]) for r in rows] == [
        ("Mul", 12), ("Exp", 12), ("Reshape", 0), ("Permute", 0), ("Sum", 12)]


def test_totals_add_the_rows_and_count_a_shared_saved_array_once():
    x = mt.tensor(np.ones((3, 4)), requires_grad=True)
    c = mt.tensor(np.ones((3, 4)))
    y = (x * c) * x  # both products keep x.data and c / x*c: x.data is shared between the two nodes
    rows = graph.ops_table(y)
    assert [r["saved_bytes"] for r in rows] == [2 * 96, 2 * 96]
    total = graph.totals(y)
    assert total["flops"] == sum(r["flops"] for r in rows) == 24
    assert total["saved_bytes"] == 3 * 96


def test_summary_prints_a_table_with_totals(capsys):
    x = mt.tensor(np.ones((2, 3)), requires_grad=True)
    text = graph.summary(F.softmax(x @ x.T).sum())
    assert capsys.readouterr().out.strip() == text.strip()
    lines = text.splitlines()
    assert lines[0].split() == ["op", "output", "shape", "FLOPs", "saved", "bytes"]
    assert [line.split()[0] for line in lines[2:5]] == ["Permute", "MatMul", "Softmax"]
    assert lines[-1].split()[:2] == ["total", f"{24 + 4 + 4:,}"]
    assert graph.summary(x * 1.0, show=False).splitlines()[2].split()[0] == "Mul"


def test_to_dot_has_one_box_per_op_and_one_ellipse_per_leaf():
    mt.manual_seed(0)
    x = mt.tensor(np.ones((2, 3)), requires_grad=True)
    w = mt.tensor(np.ones((4, 3)))
    dot = graph.to_dot(F.gelu(F.linear(x, w), approximate="tanh").sum(), legend=False)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert dot.count("shape=box") == 3 and dot.count("shape=ellipse") == 2
    assert 'label="Linear\\n(2, 4)\\n48 FLOPs"' in dot
    assert dot.count("->") == 4 and dot.count("fillcolor") == 1  # only x requires grad


def test_to_dot_names_the_given_parameters_and_draws_a_legend_of_its_shapes_and_colour():
    x = mt.tensor(np.ones((2, 3)), requires_grad=True)
    w = mt.tensor(np.ones((4, 3)), requires_grad=True)
    y = F.linear(x, w).sum()
    plain, named = graph.to_dot(y, legend=False), graph.to_dot(y, params={"fc.weight": w})
    assert 'label="fc.weight\\n(4, 3)", style=filled' in named   # the named leaf: name above shape
    assert 'label="(2, 3)", style=filled' in named                # an unnamed leaf keeps its shape only
    assert "fc.weight" not in plain and "legend" not in plain
    legend = named.split("subgraph cluster_legend {")[1].split("}")[0]
    assert "shape=box" in legend and legend.count("shape=ellipse") == 2 and legend.count("fillcolor") == 1
    assert named.count("->") == plain.count("->") == 3             # the legend adds no edges
    assert named.rstrip().endswith("}") and named.count("{") == named.count("}")


def test_the_graph_must_be_walked_before_backward_releases_it():
    x = mt.tensor(np.ones(3), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    assert len(graph.ops_table(y)) == 2
    y.backward()
    for walk in (graph.ops_table, graph.to_dot, graph.summary):
        with pytest.raises(RuntimeError, match="before backward"):
            walk(y)
