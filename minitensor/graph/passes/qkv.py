"""Fuse projections that share an input (attention's q, k and v) into one matmul.

Identity: for weights W₁ … Wₙ (rows = outputs) and biases b₁ … bₙ,
    [x W₁ᵀ + b₁ | … | x Wₙᵀ + bₙ] = x [W₁; …; Wₙ]ᵀ + [b₁ | … | bₙ],
so the n Linears become a Concat of the weights (and of the biases), one Linear, and n
GetItem slices of its last axis (numpy views: the split copies nothing). The input is
read once instead of n times, and one wide GEMM replaces n narrow ones. Backward is the
same identity: Concat's backward hands each Wᵢ its rows of the fused gradient, so the
original parameters' .grad are filled as before. The concatenated weight is a new array
kept for backward (counted in saved bytes); it is rebuilt from the current parameters on
every run, so an optimizer step on Wᵢ is seen.

That copy is the price of keeping q, k and v separate parameters (the checkpoint format):
fusing saves reading x n − 1 times (2·tokens·d bytes for three projections of width d)
and costs copying the weights (read and write, 6·d² bytes) and keeping the copy. So by
default a group is fused only where the bytes moved fall (tokens > 3·d for q, k, v);
`only_if_fewer_bytes=False` fuses every group.
"""
from minitensor.graph.ir import Node
from minitensor.graph.passes.rewrite import finish, fresh_name, nbytes, with_inserted


def _concat(parts, taken):
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    node = Node(fresh_name(taken, "concat"), "Concat", tuple(p.name for p in parts), shape, parts[0].dtype,
                {"axis": 0})
    return node.evolve(bytes_read=sum(nbytes(p) for p in parts), bytes_written=nbytes(node))


def _fuse(linears, by_name, taken):
    """The nodes replacing `linears` (all reading the same x), and {old name: its slice}."""
    x = by_name[linears[0].inputs[0]]
    weight = _concat([by_name[n.inputs[1]] for n in linears], taken)
    bias = _concat([by_name[n.inputs[2]] for n in linears], taken) if len(linears[0].inputs) == 3 else None
    fused = linears[0].evolve(
        name=fresh_name(taken, "linear"), inputs=(x.name, weight.name) + ((bias.name,) if bias else ()),
        shape=(*x.shape[:-1], weight.shape[0]), flops=sum(n.flops for n in linears),
        saved_bytes=sum(n.saved_bytes for n in linears) + nbytes(weight))
    out = nbytes(fused)  # read x, W, b; write y; a bias adds a pass over y (as trace.BYTE_RULES)
    fused = fused.evolve(bytes_read=nbytes(x) + nbytes(weight) + (nbytes(bias) + out if bias else 0),
                         bytes_written=out * (2 if bias else 1))
    slices, renames, start = [], {}, 0
    for n in linears:
        width = n.shape[-1]
        piece = Node(fresh_name(taken, "getitem"), "GetItem", (fused.name,), n.shape, n.dtype,
                     {"index": (Ellipsis, slice(start, start + width))})
        slices.append(piece)
        renames[n.name] = piece.name
        start += width
    return [weight, *([bias] if bias else []), fused, *slices], renames


def _bytes_moved(nodes):
    return sum(n.bytes_read + n.bytes_written for n in nodes)


def fuse_qkv(graph, only_if_fewer_bytes=True):
    """The graph with groups of ≥ 2 Linears reading the same value (with biases alike)
    computed as one Linear and split: every group, or those where fewer bytes move."""
    by_name, taken = graph._by_name(), {n.name for n in graph.nodes}
    groups = {}
    for n in graph.of_op("Linear"):
        groups.setdefault((n.inputs[0], len(n.inputs)), []).append(n)
    after, renames = {}, {}
    for linears in groups.values():
        if len(linears) > 1:
            new_nodes, renamed = _fuse(linears, by_name, taken)
            if only_if_fewer_bytes and _bytes_moved(new_nodes) >= _bytes_moved(linears):
                continue
            after[linears[-1].name] = new_nodes
            renames.update(renamed)
    return finish(graph, with_inserted(graph, after), renames)
