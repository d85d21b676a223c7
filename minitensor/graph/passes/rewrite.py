"""What every pass shares: fresh node names, byte sizes, and finishing a rewrite (reads
renamed, nodes re-sorted, dead nodes dropped)."""
import heapq
import math

from minitensor.graph.ir import Graph
from minitensor.graph.passes.dce import eliminate_dead_nodes


def nbytes(node):
    """The bytes of a node's output."""
    return math.prod(node.shape) * node.dtype.itemsize


def fresh_name(taken, base):
    """`base_k` with the smallest k not in `taken` (a set, updated)."""
    k = 0
    while f"{base}_{k}" in taken:
        k += 1
    taken.add(f"{base}_{k}")
    return f"{base}_{k}"


def stable_toposort(nodes):
    """The nodes in an order where each comes after the nodes it reads, keeping the given
    order wherever it already is one (Kahn's algorithm, smallest position first)."""
    position = {n.name: k for k, n in enumerate(nodes)}
    waiting = {n.name: {i for i in n.inputs if i in position} for n in nodes}
    users = {n.name: [] for n in nodes}
    for n in nodes:
        for i in waiting[n.name]:
            users[i].append(n.name)
    ready = [position[name] for name, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for user in users[node.name]:
            waiting[user].discard(node.name)
            if not waiting[user]:
                heapq.heappush(ready, position[user])
    if len(order) != len(nodes):
        raise ValueError("graph: the rewrite made a cycle")
    return order


def with_inserted(graph, after):
    """The graph's nodes with `after[name]` (new nodes) placed right after node `name`."""
    return [m for n in graph.nodes for m in (n, *after.get(n.name, ()))]


def finish(graph, nodes, renames):
    """The rewritten graph: `nodes` (the old ones and the new), every read of a name in
    `renames` redirected to its replacement, re-sorted, with the nodes no output needs removed."""
    renamed = Graph(nodes, graph.outputs).renamed_uses(renames)
    return eliminate_dead_nodes(Graph(stable_toposort(renamed.nodes), renamed.outputs)).check()
