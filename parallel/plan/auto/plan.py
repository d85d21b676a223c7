"""A sharding of a whole graph, and what it costs: compute, and every collective it needs.

`evaluate` prices a complete choice (a layout for every parameter, a rule for every op) by
adding up, for every value:
    forward    the collective turning its layout into each reader's (sharding.collective)
    backward   the collective turning its gradient — the sum of what its readers' backward
               passes leave (Rule.input_gradient, summed by sharding.join) — into the layout
               its own gradient must have (sharding.gradient_layout)
and every op's compute (Machine.compute_seconds). The graph's inputs and outputs are in
`boundary` layout (a block between replicated neighbours: R). The search (search.py) finds
the cheapest choice; this is the yardstick it is tested against.
"""
from dataclasses import dataclass, field

import numpy as np

from .rules import rules
from .sharding import REPLICATED, collective, gradient_layout, join, split_dim


def is_leaf(node):
    return not node.inputs


def value_bytes(node):
    """The whole value's bytes (not node.bytes_written: a view writes none, yet is a value)."""
    return int(np.prod(node.shape, dtype=np.int64)) * np.dtype(node.dtype).itemsize


def boundary_layout(node, boundary):
    """An input takes the boundary layout, or R when that split does not fit its shape."""
    dim = split_dim(boundary)
    return boundary if dim is None or dim < len(node.shape) else REPLICATED


def forward_seconds(node, source, target, machine, nbytes):
    """Seconds to bring `node`'s value (`nbytes`) from `source` into the layout a reader needs.
    A parameter is read as it is stored (or sliced, for free): gathering weights before use is
    ZeRO-3's business (chapter 14), not this search's, so it costs infinity here."""
    seconds = machine.reshard_seconds(source, target, nbytes)
    return float("inf") if seconds and node.op == "param" else seconds


def node_rules(graph, node, tp):
    nodes = {n.name: n for n in graph.nodes}
    return rules(node.op, node.attrs, [nodes[name].shape for name in node.inputs], node.shape, tp)


@dataclass(frozen=True)
class Collective:
    value: str           # the node whose value (forward) or gradient (backward) it moves
    direction: str       # "forward" or "backward"
    source: str
    target: str
    nbytes: int
    seconds: float

    @property
    def kind(self):
        return collective(self.source, self.target)


@dataclass
class ShardingPlan:
    layouts: dict                  # node name -> the layout of its value
    rules: dict                    # op node name -> the Rule it runs by
    compute: float                 # seconds, summed over the ops
    collectives: list = field(default_factory=list)   # those that cost time

    @property
    def communication(self):
        return sum(c.seconds for c in self.collectives)

    @property
    def seconds(self):
        return self.compute + self.communication

    def summary(self):
        """The totals and every collective, one per line."""
        lines = [f"compute {self.compute:.4g} s + communication {self.communication:.4g} s = {self.seconds:.4g} s"]
        lines += [f"  {c.direction:<9}{c.kind:<15}{c.value:<22}{c.source} → {c.target}  {c.nbytes:>12,} B  "
                  f"{c.seconds:.3g} s" for c in self.collectives]
        return "\n".join(lines)

    def table(self, graph):
        """One line per op: its output layout and its inputs' layouts, as the rule needs them."""
        lines = [f"{'node':<24}{'op':<11}{'shape':<20}{'layout':<8}inputs as"]
        for node in graph.nodes:
            if is_leaf(node):
                continue
            rule = self.rules[node.name]
            lines.append(f"{node.name:<24}{node.op:<11}{str(node.shape):<20}{rule.output:<8}"
                         + ", ".join(f"{name} {layout}" for name, layout in zip(node.inputs, rule.inputs)))
        return "\n".join(lines)


def evaluate(graph, leaf_layouts, op_rules, machine, boundary=REPLICATED):
    """The ShardingPlan of a complete choice: `leaf_layouts` for every parameter (inputs take
    `boundary`), `op_rules` for every op."""
    layouts = {n.name: leaf_layouts.get(n.name) or boundary_layout(n, boundary) if is_leaf(n)
               else op_rules[n.name].output for n in graph.nodes}
    gradients, collectives, compute = {}, [], 0.0
    nodes = {n.name: n for n in graph.nodes}

    def move(value, direction, source, target):
        nbytes = value_bytes(nodes[value])
        seconds = (forward_seconds(nodes[value], source, target, machine, nbytes) if direction == "forward"
                   else machine.reshard_seconds(source, target, nbytes))
        if seconds:
            collectives.append(Collective(value, direction, source, target, nbytes, seconds))

    for node in graph.nodes:
        if is_leaf(node):
            continue
        rule = op_rules[node.name]
        compute += machine.compute_seconds(node, rule)
        for index, name in enumerate(node.inputs):
            move(name, "forward", layouts[name], rule.inputs[index])
            gradients[name] = join(gradients.get(name), rule.input_gradient(index))
    for name in graph.outputs:
        out = boundary_layout(nodes[name], boundary)
        move(name, "forward", layouts[name], out)
        gradients[name] = join(gradients.get(name), gradient_layout(out))
    for name, gradient in gradients.items():
        if gradient is not None:
            move(name, "backward", gradient, gradient_layout(layouts[name]))
    return ShardingPlan(layouts, dict(op_rules), compute, collectives)
