"""Dead-node elimination.

Identity: the outputs y = f(x) do not depend on a value v that no output reads, directly
or through other nodes: removing v (and everything only it reads) leaves every output
and every gradient unchanged. The graph's inputs stay (they are its signature).
"""
from minitensor.graph.ir import Graph


def eliminate_dead_nodes(graph):
    """The graph without the nodes no output depends on."""
    by_name = graph._by_name()
    live, stack = set(), list(graph.outputs)
    while stack:
        name = stack.pop()
        if name not in live:
            live.add(name)
            stack.extend(by_name[name].inputs)
    return Graph([n for n in graph.nodes if n.name in live or n.op == "input"], graph.outputs)
