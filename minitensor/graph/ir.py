"""The operator graph as data: a list of nodes in topological order.

Every value is a node: the graph's inputs (op "input"), its parameters (op "param") and
each operation (op = the autograd Function's name: "MatMul", "Linear", "GELU", ...).
A node names the nodes it reads, so the graph is plain data a pass can rewrite and a
search can read without running anything.
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Node:
    name: str                        # unique in its graph, e.g. "matmul_3", "blocks.0.attn.qkv.weight"
    op: str                          # "input", "param", or the Function's name
    inputs: tuple[str, ...] = ()     # the names of the nodes it reads, in argument order
    shape: tuple[int, ...] = ()      # of its output
    dtype: np.dtype = np.dtype(np.float64)
    attrs: dict = field(default_factory=dict)  # the op's keyword parameters (axis, ...)
    flops: int = 0                   # forward FLOPs (a multiply-add counts 2)
    bytes_read: int = 0              # the inputs' bytes
    bytes_written: int = 0           # the output's bytes


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
