"""A graph you can call: `GraphModule(graph, params)(*inputs)` runs its nodes in order.

Each op node runs as `Function.apply` of the Function its op names, on the parameters'
current values, so the outputs are the eager tensors with their autograd graph behind
them: `.backward()` on one accumulates into the parameters' `.grad` exactly as the
eager run does (the same Functions, in the same order, on the same arrays).
"""
import shutil
import subprocess

import numpy as np

from minitensor.autograd import Function
from minitensor.graph.ir import LEAF_OPS
from minitensor.tensor import Tensor


def _all_functions(cls=Function):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_functions(sub)


def function_class(op):
    """The Function subclass named `op` (one name, one class: an ambiguous name is an error)."""
    found = {f for f in _all_functions() if f.__name__ == op}
    if len(found) != 1:
        where = sorted(f"{f.__module__}.{f.__qualname__}" for f in found)
        raise LookupError(f"graph: op {op!r} names {len(found)} Function classes {where}; need exactly one")
    return found.pop()


def last_uses(graph):
    """{index: names read for the last time by node `index`}: their values can be dropped there."""
    last = {}
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            last[i] = k
    drops = {}
    for name, k in last.items():
        if name not in graph.outputs:
            drops.setdefault(k, []).append(name)
    return drops


class GraphModule:
    """A graph plus the parameters it reads (by node name). `layout` says how the graph's
    outputs are returned: None for a single tensor, else a tuple of output indices or
    None (so `(logits, None)` comes back as the traced function returned it)."""

    def __init__(self, graph, params, layout=None):
        self.graph, self.params, self.layout = graph, dict(params), layout
        missing = [n.name for n in graph.nodes if n.op == "param" and n.name not in self.params]
        if missing:
            raise ValueError(f"GraphModule: no tensor given for parameters {missing}")
        # what every call needs, found once: the input nodes, where each value is last read,
        # and each op's Function (looked up on the first call that runs it)
        self.inputs, self.drops, self.functions = [n for n in graph.nodes if n.op == "input"], last_uses(graph), {}

    def check_inputs(self, inputs):
        """Inputs must match the traced ones in count, shape and dtype (shapes are baked
        into the graph: reshapes, positions, masks)."""
        nodes = self.inputs
        if len(inputs) != len(nodes):
            raise TypeError(f"graph: takes {len(nodes)} inputs {[n.name for n in nodes]}, got {len(inputs)}")
        for node, value in zip(nodes, inputs):
            data = value.data if isinstance(value, Tensor) else np.asarray(value)
            if data.shape != node.shape or data.dtype != node.dtype:
                raise ValueError(f"graph: input {node.name!r} was traced with shape {node.shape} and dtype "
                                 f"{node.dtype}, got {data.shape} and {data.dtype}; trace again for new shapes")

    def leaf_value(self, node, inputs):
        if node.op == "input":
            return inputs[node.name]
        if node.op == "param":
            return self.params[node.name]
        return Tensor(node.attrs["value"])

    def __call__(self, *inputs):
        self.check_inputs(inputs)
        given = {n.name: v for n, v in zip(self.inputs, inputs)}
        env = {}
        for k, node in enumerate(self.graph.nodes):
            if node.op in LEAF_OPS:
                env[node.name] = self.leaf_value(node, given)
            else:
                attrs = dict(node.attrs)
                for attr, source in node.attr_inputs:
                    value = env[source]
                    attrs[attr] = value.data if isinstance(value, Tensor) else np.asarray(value)
                if node.op not in self.functions:
                    self.functions[node.op] = function_class(node.op)
                env[node.name] = self.functions[node.op].apply(*(env[i] for i in node.inputs), **attrs)
            for name in self.drops.get(k, ()):
                del env[name]  # dropped when last read, as eager Python drops a temporary
        outs = [env[o] for o in self.graph.outputs]
        if self.layout is None:
            return outs[0]
        return tuple(None if i is None else outs[i] for i in self.layout)

    def transform(self, *passes):
        """A GraphModule of the graph rewritten by each pass in turn, reading the same parameters."""
        graph = self.graph
        for rewrite in passes:
            graph = rewrite(graph).check()
        return GraphModule(graph, {n.name: self.params[n.name] for n in graph.nodes if n.op == "param"},
                           self.layout)

    def print_tabular(self):
        """Print the graph's table (torch.fx's name for it)."""
        print(self.graph.table())

    def to_dot(self):
        return self.graph.to_dot()


def render_png(dot_text, path):
    """Draw DOT text to a PNG with Graphviz's `dot`; False (nothing written) without it."""
    if shutil.which("dot") is None:
        return False
    subprocess.run(["dot", "-Tpng", "-o", str(path)], input=dot_text.encode(), check=True)
    return True
