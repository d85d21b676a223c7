"""Which input layouts each op accepts, and the layout of its output then (its sharding rules).

A rule is one way to run an op on n ranks: the layout each input must be in, the layout
the output comes out in, and whether the work is divided (some input or the output is
split, so each rank does 1/n of the FLOPs) or repeated on every rank. Examples:

    Linear  x R,    W S(0), b S(0) → y S(last)   column-parallel: each rank its output features
    Linear  x S(last), W S(1), b P → y P         row-parallel: the contracted dimension is split,
                                                 each rank a partial sum
    Linear  x S(d)  (d a batch dim), W R, b R → y S(d)   split the rows: data parallel in the block
    MatMul  a S(k), b S(k) → P;   a S(m), b R → S(m);   a R, b S(n) → S(n);   batch dims split alike
    elementwise   all inputs S(d) (a broadcast input R) → S(d); linear ones also P → P
    Softmax, LayerNorm   split anywhere but the normalized axis
    Reshape, Permute, Sum   move S(d) to where dimension d lands; Sum over d turns S(d) into P
Every op also runs replicated (all R → R); ops not listed run only so.
"""
from dataclasses import dataclass
from math import prod

from .sharding import PARTIAL, REPLICATED, split, split_dim

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Relu", "Gelu",
               "Cast", "Where"}


@dataclass(frozen=True)
class Rule:
    inputs: tuple        # the layout each input must be in, in argument order
    output: str

    @property
    def divided(self):
        """The work is split over the ranks (each does 1/n of it) rather than repeated."""
        return any(split_dim(layout) is not None for layout in (*self.inputs, self.output))

    def input_gradient(self, index):
        """The layout in which this op's backward leaves the gradient of input `index`: a split
        input's is split alike, a partial input's is whole (the output's gradient passes
        through unchanged); a replicated input's is whole only if the op ran replicated —
        otherwise each rank holds its share's contribution, a partial sum."""
        layout = self.inputs[index]
        if split_dim(layout) is not None:
            return layout
        if layout == PARTIAL or self.output == REPLICATED:
            return REPLICATED
        return PARTIAL


def rules(op, attrs, input_shapes, shape, tp):
    """Every rule for an op with these input shapes and output `shape` over tp ranks."""
    found = [Rule((REPLICATED,) * len(input_shapes), REPLICATED)]
    maker = elementwise_rules if op in ELEMENTWISE else RULES.get(op)
    if maker is not None:
        found += maker(attrs, input_shapes, shape, tp, op)
    return found


def divides(size, tp):
    return size % tp == 0


def axis_of(axis, ndim):
    return axis % ndim


def broadcast_split(input_shape, shape, dim):
    """The layout of a broadcast input when the output is split on `dim`: split on its own
    matching dimension, or replicated where it is broadcast (absent or of size 1)."""
    own = dim - (len(shape) - len(input_shape))
    if own < 0 or input_shape[own] != shape[dim]:
        return REPLICATED
    return split(own)


def elementwise_rules(attrs, input_shapes, shape, tp, op):
    found = [Rule(tuple(broadcast_split(s, shape, d) for s in input_shapes), split(d))
             for d, size in enumerate(shape) if divides(size, tp)]
    n = len(input_shapes)
    if op in ("Add", "Sub", "Neg", "Cast"):        # linear in every input: partial sums add up
        found.append(Rule((PARTIAL,) * n, PARTIAL))
    elif op == "Mul":                              # linear in each input: one partial, the others whole
        found += [Rule(tuple(PARTIAL if i == j else REPLICATED for i in range(n)), PARTIAL) for j in range(n)]
    elif op == "Div":                              # linear in the numerator only
        found.append(Rule((PARTIAL,) + (REPLICATED,) * (n - 1), PARTIAL))
    return found



def linear_rules(attrs, input_shapes, shape, tp, op):
    x, weight = input_shapes[:2]
    last, has_bias = len(shape) - 1, len(input_shapes) == 3

    def rule(x_layout, weight_layout, bias_layout, output):
        return Rule((x_layout, weight_layout) + ((bias_layout,) if has_bias else ()), output)
    found = [rule(split(d), REPLICATED, REPLICATED, split(d)) for d in range(last) if divides(shape[d], tp)]
    if divides(weight[0], tp):   # column-parallel: output features split
        found.append(rule(REPLICATED, split(0), split(0), split(last)))
    if divides(weight[1], tp):   # row-parallel: the contracted features split, a partial sum out
        found.append(rule(split(len(x) - 1), split(1), PARTIAL, PARTIAL))
    return found


def matmul_rules(attrs, input_shapes, shape, tp, op):
    a, b = input_shapes
    if len(a) < 2 or len(b) < 2:
        return []
    m, n = len(shape) - 2, len(shape) - 1
    found = []
    for d in range(m):         # a batch dimension: both operands split alike (or broadcast)
        if divides(shape[d], tp):
            found.append(Rule((broadcast_split(a[:-2], shape[:-2], d), broadcast_split(b[:-2], shape[:-2], d)),
                              split(d)))
    if divides(shape[m], tp):
        found.append(Rule((split(len(a) - 2), REPLICATED), split(m)))
    if divides(shape[n], tp):
        found.append(Rule((REPLICATED, split(len(b) - 1)), split(n)))
    if divides(a[-1], tp):
        found.append(Rule((split(len(a) - 1), split(len(b) - 2)), PARTIAL))
    return found


def normalizing_rules(attrs, input_shapes, shape, tp, op):
    """Softmax, LogSoftmax (over `axis`) and LayerNorm (over the last axis): split elsewhere."""
    axis = axis_of(attrs.get("axis", -1), len(shape))
    extra = (REPLICATED,) * (len(input_shapes) - 1)        # LayerNorm's weight and bias
    return [Rule((split(d),) + extra, split(d)) for d, size in enumerate(shape) if d != axis and divides(size, tp)]


def reshape_rules(attrs, input_shapes, shape, tp, op):
    """S(d) → S(e) when dimension d's slices are dimension e's: the same number of elements
    before both (so their flattened ranges coincide) and tp divides both sizes."""
    (source,) = input_shapes
    found = [Rule((PARTIAL,), PARTIAL)]
    for d, size in enumerate(source):
        for e, out in enumerate(shape):
            if prod(source[:d]) == prod(shape[:e]) and divides(size, tp) and divides(out, tp) \
                    and size > 1 and out > 1:
                found.append(Rule((split(d),), split(e)))
    return found


def permute_rules(attrs, input_shapes, shape, tp, op):
    axes = [axis_of(a, len(shape)) for a in attrs["axes"]]
    return [Rule((PARTIAL,), PARTIAL)] + [Rule((split(axes[e]),), split(e))
                                          for e in range(len(shape)) if divides(shape[e], tp)]


def reduction_rules(attrs, input_shapes, shape, tp, op):
    (source,) = input_shapes
    axis = attrs.get("axis")
    reduced = set(range(len(source))) if axis is None else \
        {axis_of(a, len(source)) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
    keep = attrs.get("keepdims", False)
    found = [Rule((PARTIAL,), PARTIAL)] if op == "Sum" else []
    for d, size in enumerate(source):
        if not divides(size, tp):
            continue
        if d in reduced:
            if op == "Sum":                      # each rank sums its slice: a partial sum
                found.append(Rule((split(d),), PARTIAL))
        else:
            found.append(Rule((split(d),), split(d if keep else d - sum(r < d for r in reduced))))
    return found


def embedding_rules(attrs, input_shapes, shape, tp, op):
    """The table split on its embedding dimension: each rank looks up its features."""
    weight, idx = input_shapes
    return [Rule((split(1), REPLICATED), split(len(shape) - 1))] if divides(weight[1], tp) else []


RULES = {"Linear": linear_rules, "MatMul": matmul_rules, "Softmax": normalizing_rules,
         "LogSoftmax": normalizing_rules, "LayerNorm": normalizing_rules, "Reshape": reshape_rules,
         "Permute": permute_rules, "Sum": reduction_rules, "Max": reduction_rules, "Embedding": embedding_rules}
