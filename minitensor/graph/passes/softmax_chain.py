"""Fuse attention's elementwise chain — scale, mask, softmax — into one Softmax node.

Identity: with s > 0 a scalar and M a boolean mask,
    softmax(where(M, −∞, c·x)) = Softmax(x; scale = c, mask = M),
the engine's fused Softmax kernel (minitensor.nn.functional.Softmax), which scales,
masks and normalises in one buffer. A softmax that already scales by k > 0 takes the
product k·c (−∞·k = −∞, so the mask commutes with it), and a softmax that already masks
takes the union of both masks; x / c is x · (1/c).

Backward, derived once for the chain: with y the output and z = c·x masked,
dz = y ⊙ (dy − Σ dy⊙y) (softmax), zero on masked entries because y = 0 there, and
dx = c·dz (the scale): dx = c · y ⊙ (dy − Σ dy⊙y) — what Softmax.backward computes
from y alone. Unfused, the chain keeps c·x for the multiply's backward and the mask for
the where's; fused it keeps only y (the saved bytes fall by one score matrix).
"""
import numpy as np

from minitensor.graph.passes.rewrite import finish, fresh_name, nbytes, with_inserted


def _scalar(node):
    """The value of a one-element constant node, else None."""
    if node.op == "constant" and node.attrs["value"].size == 1:
        return node.attrs["value"].item()
    return None


def _unmask(where, by_name):
    """(x, mask) if `where` is where(M, −∞, x) or where(M, x, −∞), else None."""
    a, b = (by_name[i] for i in where.inputs)
    if _scalar(a) == -np.inf:
        return b, where.attrs["cond"]
    if _scalar(b) == -np.inf:
        return a, ~where.attrs["cond"]
    return None


def _unscale(node, by_name):
    """(x, c) if `node` is x·c, c·x or x / c with c a scalar constant, else None."""
    a, b = (by_name[i] for i in node.inputs)
    if node.op == "Mul":
        for x, c in ((a, b), (b, a)):
            if _scalar(c) is not None:
                return x, _scalar(c)
    if node.op == "Div" and _scalar(b) not in (None, 0):
        return a, 1.0 / _scalar(b)
    return None


def _absorb_chain(softmax, by_name, counts):
    """The fused attrs, the chain's input and the nodes absorbed, walking up from a Softmax."""
    attrs = {"scale": 1.0, "mask": None, **softmax.attrs}
    source, absorbed = by_name[softmax.inputs[0]], []
    if source.op == "Where" and counts[source.name] == 1 and attrs["scale"] > 0 and source.shape == softmax.shape:
        found = _unmask(source, by_name)
        if found is not None and found[0].shape == softmax.shape:
            mask = found[1]
            attrs["mask"] = mask if attrs["mask"] is None else np.logical_or(attrs["mask"], mask)
            absorbed.append(source)
            source = found[0]
    if source.op in ("Mul", "Div") and counts[source.name] == 1:
        found = _unscale(source, by_name)
        if found is not None and found[0].shape == softmax.shape:
            attrs["scale"] *= found[1]
            absorbed.append(source)
            source = found[0]
    return attrs, source, absorbed


def fuse_softmax_chain(graph):
    """The graph with each scale → mask → softmax chain as one Softmax node."""
    by_name, counts, taken = graph._by_name(), graph.user_counts(), {n.name for n in graph.nodes}
    replaced, renames = {}, {}
    for softmax in graph.of_op("Softmax"):
        attrs, source, absorbed = _absorb_chain(softmax, by_name, counts)
        if absorbed:
            fused = softmax.evolve(name=fresh_name(taken, "softmax"), inputs=(source.name,), attrs=attrs,
                                   flops=softmax.flops + sum(n.flops for n in absorbed), bytes_read=nbytes(source))
            replaced[softmax.name] = [fused]
            renames[softmax.name] = fused.name
    return finish(graph, with_inserted(graph, replaced), renames)
