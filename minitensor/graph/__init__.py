"""Operator graphs.

`eager`: see the graph an eager computation left behind a tensor (a table of FLOPs and
saved bytes, Graphviz DOT). `ir`: the graph as data (nodes, shapes, costs), which tracing
produces and which rewrites and the sharding search read. `trace`: capture a function's
ops as such a graph (`trace_checks`: what it refuses or warns about); `graph_module`: run
it (and differentiate through it).
"""
from minitensor.graph import passes  # noqa: E402  (registers the fused ops, e.g. BiasGelu)
from minitensor.graph.eager import FLOP_RULES, flops, ops_table, saved_arrays, summary, to_dot, totals
from minitensor.graph.graph_module import GraphModule, render_png
from minitensor.graph.ir import Graph, Node
from minitensor.graph.trace import trace
from minitensor.graph.trace_checks import FrozenDropoutWarning, TraceError

__all__ = ["FLOP_RULES", "FrozenDropoutWarning", "Graph", "GraphModule", "Node", "TraceError", "flops", "ops_table",
           "passes", "render_png", "saved_arrays", "summary", "to_dot", "totals", "trace"]
