"""Common-subexpression elimination.

Identity: every op is a function of its inputs and attributes, so y₁ = f(a; θ) and
y₂ = f(a; θ) are equal and y₂ can read y₁: f(a) computed twice is f(a) computed once.
Gradients are unchanged too: ∂L/∂a sums over the uses of y₁, which are now y₁'s and y₂'s
(only the order of that sum changes, a round-off). Constants with equal values (dtype,
shape, bytes) are one constant. Inputs and parameters are never merged: two of them
are different values even when they hold equal numbers today.
"""
import numpy as np

from minitensor.graph.passes.rewrite import finish


def canonical(value):
    """A hashable stand-in for an attribute: arrays by dtype, shape and bytes; tuples and
    lists element by element; anything else by its repr (slices, dtypes, floats exactly)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *map(canonical, value))
    return repr(value)


def node_key(node):
    """Two nodes with equal keys compute the same value (None: never merge this node)."""
    if node.op in ("input", "param"):
        return None
    attrs = tuple(sorted((k, canonical(v)) for k, v in node.attrs.items()))
    return node.op, node.inputs, attrs, node.attr_inputs


def eliminate_common_subexpressions(graph):
    """The graph with each repeated computation done once (later copies read the first)."""
    # exercise 18.1: common-subexpression elimination
    # hint: walk graph.nodes in order; a node whose key (node_key, after renaming its inputs to the
    # hint: nodes that replaced them) was seen before is renamed to that first node and dropped.
    first, renames, kept = {}, {}, []
    for node in graph.nodes:
        node = node.evolve(inputs=tuple(renames.get(i, i) for i in node.inputs))
        key = node_key(node)
        if key is not None and key in first:
            renames[node.name] = first[key]
            continue
        if key is not None:
            first[key] = node.name
        kept.append(node)
    # end exercise
    return finish(graph, kept, renames)
