"""Transpose elimination.

Identities: a permutation of a permutation is one permutation, and none at all when they
cancel: transpose(transpose(x, p), q) = transpose(x, p∘q) with (p∘q)[j] = p[q[j]], and
xᵀᵀ = x. And (AB)ᵀ = BᵀAᵀ: the transpose (of the last two axes) of a product is the
product of the transposed factors in the other order. numpy transposes by changing
strides (a view, no copy); the copy comes when a transposed value is reshaped (merging
axes of a non-contiguous array copies it). So (AB)ᵀ is rewritten only where its reshape
copies: BᵀAᵀ writes the product already in the transposed layout, and the reshape
becomes a view — the copy (read and write of the whole value) disappears.
"""
from minitensor.graph.passes.rewrite import finish, fresh_name


def composed(outer, inner_axes):
    """The one Permute equal to `outer` applied to Permute(x, inner_axes): axes p[q[j]]."""
    return tuple(inner_axes[j] for j in outer.attrs["axes"])


def swaps_last_two(axes):
    n = len(axes)
    return n >= 2 and tuple(axes) == (*range(n - 2), n - 1, n - 2)


def _merge_permutes(graph, nodes, renames):
    """Permute(Permute(x)) → Permute(x), or x when the axes cancel; identity Permutes → x."""
    by_name = graph._by_name()
    out = []
    for node in nodes:
        if node.op == "Permute":
            source = by_name[renames.get(node.inputs[0], node.inputs[0])]
            axes = node.attrs["axes"]
            if source.op == "Permute":
                axes = composed(node, source.attrs["axes"])
                node = node.evolve(inputs=source.inputs, attrs={**node.attrs, "axes": axes})
            if axes == tuple(range(len(axes))):
                renames[node.name] = node.inputs[0]
                continue
        out.append(node)
        by_name[node.name] = node
    return out


def _transpose_products(graph, taken):
    """Reshape(Permute_last_two(MatMul(A, B))) that copies → Reshape(MatMul(Bᵀ, Aᵀ)), a view."""
    by_name, counts = graph._by_name(), graph.user_counts()
    out = []
    for node in graph.nodes:
        out.append(node)
        if node.op != "Reshape" or node.bytes_written == 0:
            continue
        permute = by_name[node.inputs[0]]
        if permute.op != "Permute" or not swaps_last_two(permute.attrs["axes"]) or counts[permute.name] != 1:
            continue
        product = by_name[permute.inputs[0]]
        if product.op != "MatMul" or counts[product.name] != 1:
            continue
        a, b = (by_name[i] for i in product.inputs)
        if a.shape[:-2] != b.shape[:-2]:
            continue  # broadcast batch axes: keep it simple
        flipped = []
        for factor in (b, a):
            axes = (*range(len(factor.shape) - 2), len(factor.shape) - 1, len(factor.shape) - 2)
            shape = (*factor.shape[:-2], factor.shape[-1], factor.shape[-2])
            flipped.append(permute.evolve(name=fresh_name(taken, "permute"), inputs=(factor.name,),
                                          shape=shape, attrs={"axes": axes}, saved_bytes=0))
        matmul = product.evolve(name=fresh_name(taken, "matmul"), inputs=tuple(f.name for f in flipped),
                                shape=permute.shape)
        out[-1:] = [*flipped, matmul, node.evolve(inputs=(matmul.name,), bytes_read=0, bytes_written=0)]
    return out


def eliminate_transposes(graph):
    """The graph with Permute chains merged or removed and copying (AB)ᵀ turned into BᵀAᵀ."""
    renames = {}
    taken = {n.name for n in graph.nodes}
    nodes = _merge_permutes(graph, graph.nodes, renames)
    merged = finish(graph, nodes, renames)
    return finish(merged, _transpose_products(merged, taken), {})
