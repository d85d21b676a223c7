"""The operator graph as data: a list of nodes in topological order.

Every value is a node: the graph's inputs (op "input"), its parameters (op "param"),
values that do not depend on either (op "constant", the array in attrs["value"]) and
each operation (op = the autograd Function's name: "MatMul", "Linear", "Gelu", ...).
A node names the nodes it reads, so the graph is plain data a pass can rewrite and a
search can read without running anything.

Costs are those of the forward as minitensor runs it: `flops` by `eager.FLOP_RULES`;
`bytes_read` and `bytes_written` are the bytes of the op's tensor inputs and output when
it makes a new array (0 and 0 for a view: numpy's reshape, transpose and slicing copy
nothing), plus any extra pass its kernel makes (see trace.BYTE_RULES); `saved_bytes` are
the activations it keeps for backward (parameters and arrays an earlier node already
keeps are not counted again).
"""
from dataclasses import dataclass, field, replace

import numpy as np

LEAF_OPS = ("input", "param", "constant")
LEAF_FILL = ", style=filled, fillcolor=lightblue"  # DOT: a leaf that requires grad (a parameter)


def text_table(header, rows, footer, left):
    """Rows of strings as aligned text: the first `left` columns left-aligned, the rest
    right-aligned (numbers), a rule under the header and above the footer."""
    widths = [max(len(r[i]) for r in [header, footer, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, rows), rule, line(footer)])


def dot_document(lines):
    """DOT statements as one left-to-right Graphviz graph."""
    return "digraph minitensor {\n  rankdir=LR;\n" + "\n".join(lines) + "\n}\n"


@dataclass(frozen=True)
class Node:
    name: str                        # unique in its graph, e.g. "matmul_3", "blocks.0.attn.q.weight"
    op: str                          # "input", "param", "constant", or the Function's name
    inputs: tuple[str, ...] = ()     # the names of the nodes it reads, in argument order
    shape: tuple[int, ...] = ()      # of its output
    dtype: np.dtype = np.dtype(np.float64)
    attrs: dict = field(default_factory=dict)  # the op's keyword parameters (axis, ...)
    flops: int = 0                   # forward FLOPs (a multiply-add counts 2)
    bytes_read: int = 0              # the inputs' bytes
    bytes_written: int = 0           # the output's bytes
    saved_bytes: int = 0             # activations kept for backward (not parameters)
    # attrs whose value is a graph input given as a numpy array (Embedding's idx = input
    # "idx"): (attr, input name) pairs; running the graph passes the new input there
    attr_inputs: tuple[tuple[str, str], ...] = ()

    def evolve(self, **changes):
        """A copy with some fields changed (nodes are immutable: passes build new ones)."""
        return replace(self, **changes)


@dataclass
class Graph:
    nodes: list[Node]                # topological: a node comes after every node it reads
    outputs: tuple[str, ...]         # the names of the nodes the graph returns

    def node(self, name):
        return self._by_name()[name]

    def users(self, name):
        """The nodes that read `name`, in graph order."""
        return [n for n in self.nodes if name in n.inputs]

    def of_op(self, op):
        return [n for n in self.nodes if n.op == op]

    def _by_name(self):
        return {n.name: n for n in self.nodes}

    def edges(self):
        """(source, destination) for every value an op reads, attributes read from inputs included."""
        return [(i, n.name) for n in self.nodes for i in (*n.inputs, *(v for _, v in n.attr_inputs))]

    def user_counts(self):
        """{name: how many times it is read} (an output counts as one read)."""
        counts = {n.name: 0 for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                counts[i] += 1
        for o in self.outputs:
            counts[o] += 1
        return counts

    def renamed_uses(self, renames):
        """The graph with every read of a name in `renames` ({old: new}) reading the new one."""
        def fix(name):
            while name in renames:
                name = renames[name]
            return name
        nodes = [n.evolve(inputs=tuple(fix(i) for i in n.inputs)) for n in self.nodes]
        return Graph(nodes, tuple(fix(o) for o in self.outputs))

    def check(self):
        """Raise unless names are unique and every node reads only nodes before it."""
        seen = set()
        for n in self.nodes:
            missing = [i for i in n.inputs if i not in seen]
            if missing or n.name in seen:
                raise ValueError(f"graph: node {n.name!r} reads {missing} before they are defined"
                                 if missing else f"graph: two nodes are named {n.name!r}")
            seen.add(n.name)
        if not set(self.outputs) <= seen:
            raise ValueError(f"graph: outputs {sorted(set(self.outputs) - seen)} are not nodes")
        return self

    def totals(self):
        """Nodes that compute (not inputs, parameters or constants), FLOPs, bytes moved
        (read + written) and saved-activation bytes of the whole forward."""
        ops = [n for n in self.nodes if n.op not in LEAF_OPS]
        return {"nodes": len(ops), "flops": sum(n.flops for n in ops),
                "bytes_moved": sum(n.bytes_read + n.bytes_written for n in ops),
                "saved_bytes": sum(n.saved_bytes for n in ops)}

    def table(self):
        """One line per node (name, op, inputs (and attr=input), output shape, FLOPs, bytes moved, saved
        bytes) and a line of totals, as text."""
        header = ("name", "op", "inputs", "shape", "FLOPs", "bytes moved", "saved bytes")
        rows = [(n.name, n.op, ", ".join(n.inputs + tuple(f"{k}={v}" for k, v in n.attr_inputs)), str(n.shape),
                 f"{n.flops:,}",
                 f"{n.bytes_read + n.bytes_written:,}", f"{n.saved_bytes:,}") for n in self.nodes]
        t = self.totals()
        footer = ("total", f"{t['nodes']} ops", "", "", f"{t['flops']:,}", f"{t['bytes_moved']:,}",
                  f"{t['saved_bytes']:,}")
        return text_table(header, rows, footer, left=4)

    def to_dot(self):
        """Graphviz DOT text: a box per op (op, output shape, FLOPs), an ellipse per input,
        parameter (filled) or constant, an edge from each value to the ops that read it (dashed
        where an op reads an input as a keyword attribute, as Embedding reads idx)."""
        style = {"input": "shape=ellipse", "param": "shape=ellipse" + LEAF_FILL,
                 "constant": "shape=ellipse, style=dashed"}
        ids = {n.name: f"n{i}" for i, n in enumerate(self.nodes)}
        lines = []
        for n in self.nodes:
            if n.op in LEAF_OPS:
                lines.append(f'  {ids[n.name]} [{style[n.op]}, label="{n.name}\\n{n.shape}"];')
            else:
                lines.append(f'  {ids[n.name]} [shape=box, label="{n.op}\\n{n.shape}\\n{n.flops:,} FLOPs"];')
            lines.extend(f"  {ids[i]} -> {ids[n.name]};" for i in n.inputs)
            lines.extend(f'  {ids[i]} -> {ids[n.name]} [style=dashed, label="{k}"];' for k, i in n.attr_inputs)
        lines.extend(f'  {ids[o]} -> out{k}; out{k} [shape=plaintext, label="output {k}"];'
                     for k, o in enumerate(self.outputs))
        return dot_document(lines)
