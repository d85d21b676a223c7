"""Operator graphs.

`eager`: see the graph an eager computation left behind a tensor (a table of FLOPs and
saved bytes, Graphviz DOT). `ir`: the graph as data (nodes, shapes, costs), which tracing
produces and which rewrites and the sharding search read.
"""
from minitensor.graph.eager import FLOP_RULES, flops, ops_table, saved_arrays, summary, to_dot, totals
from minitensor.graph.ir import Graph, Node

__all__ = ["FLOP_RULES", "Graph", "Node", "flops", "ops_table", "saved_arrays", "summary", "to_dot", "totals"]
