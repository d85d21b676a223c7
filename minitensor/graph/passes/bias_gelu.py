"""Fuse a bias add into the GELU after it: one elementwise kernel instead of two passes.

Identity: Linear(x, W, b) = x Wᵀ + b, so gelu(Linear(x, W, b)) = gelu(Linear(x, W) + b)
= BiasGelu(Linear(x, W), b); likewise gelu(y + b) = BiasGelu(y, b) for a bias b over the
last axis. Before, the bias was a separate pass over y (Linear's in-place `y += b`, or
an Add writing a new array that Gelu reads again); after, the add happens inside the
GELU kernel as it reads y (Megatron-LM's bias_gelu fusion, with the Linear told to skip
its bias).
"""
import numpy as np

from minitensor.graph.passes.rewrite import finish, fresh_name, nbytes, with_inserted
from minitensor.operands import unbroadcast
from minitensor.unary_ops import Gelu


class BiasGelu(Gelu):
    """y = gelu(z) with z = y_in + b (b over the last axis).

    Backward, derived once for the chain: ∂z/∂y_in = 1 and ∂z/∂b = 1 summed over every
    axis but the last, so dy_in = gelu'(z)·dy (Gelu's backward on the saved z) and
    db = Σ_leading dy_in.
    """

    def forward(self, y, bias, inplace=False):
        self.bias_shape = bias.shape
        # z = y + b, kept by Gelu for backward. In place when the pass found y to be a new
        # array no other node reads (as Linear adds its bias into its own GEMM output):
        # a second array of y's size would stay alive until backward.
        return super().forward(np.add(y, bias, out=y) if inplace else y + bias)

    def backward(self, grad):
        # exercise 18.2: bias + GELU backward
        # hint: z = y + b, so dy = gelu'(z)·grad (Gelu's backward: super().backward) and db is that
        # hint: summed back to the bias's shape (unbroadcast); return both.
        dz = super().backward(grad)
        return dz, unbroadcast(dz, self.bias_shape)
        # end exercise


# Ops whose output is a new array that they do not keep for their own backward (Exp,
# Tanh, Softmax keep theirs): BiasGelu may add into it when it is its only reader.
FRESH_OUTPUT_OPS = ("Linear", "MatMul")


def _is_last_axis_bias(bias, y):
    return len(bias.shape) == 1 and y.shape[-1:] == bias.shape


def _split_bias(node, by_name, counts, taken):
    """(new nodes, y, bias, FLOPs absorbed, whether BiasGelu may add into y in place) if
    `node` (a Gelu's input, read only by it) is a Linear with a bias (then y is that Linear
    without it, a new node) or an Add of a last-axis bias."""
    if counts[node.name] != 1:
        return None
    if node.op == "Linear" and len(node.inputs) == 3:
        bias, out = by_name[node.inputs[2]], nbytes(node)  # no bias: its read, and the pass over y, go
        y = node.evolve(name=fresh_name(taken, "linear"), inputs=node.inputs[:2],
                        bytes_read=node.bytes_read - nbytes(bias) - out, bytes_written=node.bytes_written - out)
        return [y], y, bias, 0, True  # (a Linear's bias add is not in its FLOPs)
    if node.op == "Add":
        a, b = (by_name[i] for i in node.inputs)
        for y, bias in ((a, b), (b, a)):
            if _is_last_axis_bias(bias, y) and y.shape == node.shape:
                return [], y, bias, node.flops, y.op in FRESH_OUTPUT_OPS and counts[y.name] == 1
    return None


def fuse_bias_gelu(graph):
    """The graph with Gelu(Linear with bias) and Gelu(Add of a bias) as BiasGelu nodes."""
    by_name, counts, taken = graph._by_name(), graph.user_counts(), {n.name for n in graph.nodes}
    replaced, renames = {}, {}
    for gelu in graph.of_op("Gelu"):
        found = _split_bias(by_name[gelu.inputs[0]], by_name, counts, taken)
        if found is None:
            continue
        new_nodes, y, bias, add_flops, inplace = found
        fused = gelu.evolve(name=fresh_name(taken, "biasgelu"), op="BiasGelu", inputs=(y.name, bias.name),
                            attrs={"inplace": inplace}, flops=gelu.flops + add_flops,
                            bytes_read=nbytes(y) + nbytes(bias))
        replaced[gelu.name] = [*new_nodes, fused]
        renames[gelu.name] = fused.name
    return finish(graph, with_inserted(graph, replaced), renames)
