"""See the graph behind a tensor: Graphviz DOT text, and a table of FLOPs and saved memory.

    logits, loss = model(idx, targets)
    graph.summary(loss)                 # prints the table (and returns it as a string)
    open("g.dot", "w").write(graph.to_dot(loss, params=dict(model.named_parameters())))
    loss.backward()

Walk the graph BEFORE `backward()`: backward releases every node it passes (that is how
saved activations are freed), so afterwards there is nothing left to show, and both
functions raise. Use `backward(retain_graph=True)` to keep it.

FLOPs count multiply-adds as 2: a matmul or linear is 2·M·N·K per batch, moving elements
around (reshape, indexing, ...) is free, everything else costs about one FLOP per element
of its output (its input for reductions). Ops not named in `FLOP_RULES` fall back to that.
"""
import math

import numpy as np

from minitensor.autograd import RELEASED, topological_order
from minitensor.graph.ir import LEAF_FILL, dot_document, text_table


def _matmul(node, out_shape):
    return 2 * math.prod(out_shape) * node.inputs[0].shape[-1]  # each output is a K-long dot product


def _free(node, out_shape):
    return 0


def _per_input_element(node, out_shape):
    return node.inputs[0].size


def _per_output_element(node, out_shape):
    return math.prod(out_shape)


FLOP_RULES = {
    "MatMul": _matmul, "Linear": _matmul,
    "Reshape": _free, "Permute": _free, "GetItem": _free, "Concat": _free, "Stack": _free, "Embedding": _free,
    "Sum": _per_input_element, "Max": _per_input_element, "CrossEntropy": _per_input_element,
}


def flops(node, out_shape):
    """FLOPs of one op's forward, by the rule for its name."""
    return FLOP_RULES.get(node.name, _per_output_element)(node, out_shape)


def saved_arrays(node):
    """The arrays a node keeps for backward: `node.saved` plus its array attributes (saved
    arrays a saved_tensors_hooks pack replaced are read as packed, not unpacked)."""
    saved = getattr(node, "saved", ())
    arrays = [a for a in getattr(saved, "packed", saved) if isinstance(a, np.ndarray)]
    return arrays + [v for k, v in vars(node).items() if k != "saved" and isinstance(v, np.ndarray)]


def _op_tensors(tensor):
    if tensor._node is RELEASED:
        raise RuntimeError("the graph was released by backward(); walk it before backward() "
                           "(or call backward(retain_graph=True))")
    return [t for t in topological_order(tensor) if t._node is not None]


def ops_table(tensor):
    """One row per op, inputs first: {"op", "shape", "flops", "saved_bytes"}."""
    return [{"op": t._node.name, "shape": t.shape, "flops": flops(t._node, t.shape),
             "saved_bytes": sum(a.nbytes for a in saved_arrays(t._node))}
            for t in _op_tensors(tensor)]


def totals(tensor):
    """Total FLOPs and saved bytes (an array kept by several nodes counts once)."""
    ops = _op_tensors(tensor)
    unique = {id(a): a for t in ops for a in saved_arrays(t._node)}
    return {"flops": sum(flops(t._node, t.shape) for t in ops),
            "saved_bytes": sum(a.nbytes for a in unique.values())}


def summary(tensor, show=True, file=None):
    """A table of ops, output shapes, FLOPs and saved bytes with totals; printed to
    `file` (default: stdout) when `show`, and returned as a string."""
    rows = [(r["op"], str(r["shape"]), f"{r['flops']:,}", f"{r['saved_bytes']:,}") for r in ops_table(tensor)]
    total = totals(tensor)
    header = ("op", "output shape", "FLOPs", "saved bytes")
    footer = ("total", "", f"{total['flops']:,}", f"{total['saved_bytes']:,}")
    text = text_table(header, rows, footer, left=2)
    if show:
        print(text, file=file)
    return text


DOT_LEGEND = f"""  subgraph cluster_legend {{
    label="legend"; fontsize=10; color=grey;
    legend_op [shape=box, label="op\\noutput shape\\nFLOPs"];
    legend_grad [shape=ellipse, label="leaf that requires grad\\n(name if given)"{LEAF_FILL}];
    legend_data [shape=ellipse, label="leaf without grad\\n(data)"];
  }}"""


def to_dot(tensor, params=None, legend=True):
    """Graphviz DOT text: a box per op (name, output shape, FLOPs), an ellipse per leaf
    (shape; filled when it requires grad), edges from inputs to the op that uses them.
    params: {name: tensor} (as `dict(model.named_parameters())`, like torchviz's
    make_dot): those leaves are labelled with their name above their shape.
    legend: add a box explaining the shapes and the fill colour."""
    names = {id(t): name for name, t in (params or {}).items()}
    ids, lines = {}, []

    def node_id(t):
        if id(t) not in ids:
            ids[id(t)] = f"t{len(ids)}"
            if t._node is None:
                label = f"{names[id(t)]}\\n{t.shape}" if id(t) in names else f"{t.shape}"
                fill = LEAF_FILL if t.requires_grad else ""
                lines.append(f'  {ids[id(t)]} [shape=ellipse, label="{label}"{fill}];')
        return ids[id(t)]

    for t in _op_tensors(tensor):
        for inp in t._node.inputs:
            lines.append(f"  {node_id(inp)} -> {node_id(t)};")
        lines.append(f'  {node_id(t)} [shape=box, label="{t._node.name}\\n{t.shape}\\n'
                     f'{flops(t._node, t.shape):,} FLOPs"];')
    if not ids:
        node_id(tensor)
    if legend:
        lines.append(DOT_LEGEND)
    return dot_document(lines)
