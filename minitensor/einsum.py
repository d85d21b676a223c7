"""`einsum`: sums of products named by index letters, `torch.einsum("bij,bjk->bik", a, b)`.

    y[out] = Σ over the letters not in out of  Π_k  x_k[letters of operand k]

The gradient of one operand is the same kind of sum: dy times every OTHER operand, summed
over the letters the operand does not have, which is again an einsum,

    dx_k[s_k] = Σ  dy[out] · Π_{j≠k} x_j[s_j]        (einsum "out,s_j,...->s_k")

with three cases einsum's output cannot express: a letter only operand k has (summed in
the forward, so each of its entries gets the whole gradient: a broadcast), a letter
repeated in s_k (a diagonal, "ii->i": the gradient goes onto the diagonal, 0 elsewhere),
and a dim of size 1 that broadcast against a longer one (summed back to 1).

The equation is first written out in full (`explicit`): `...` becomes letters of its own,
and an equation without `->` gets PyTorch's output, the letters used once, in order.
"""
import string

import numpy as np

from minitensor.autograd import Function
from minitensor.errors import ShapeError
from minitensor.operands import promoted

LETTERS = string.ascii_letters


def _ellipsis_letters(equation, ndims):
    """As many unused letters as the widest `...` spans."""
    unused = [c for c in LETTERS if c not in equation]
    spans = [n - len(term.replace("...", "")) for term, n in zip(equation.split("->")[0].split(","), ndims)
             if "..." in term]
    return "".join(unused[:max(spans, default=0)])


def explicit(equation, ndims):
    """`equation` with `...` spelled out in letters (the last dims of each operand), and
    its output made explicit: `(inputs, output)`, each a string of letters."""
    equation = equation.replace(" ", "")
    terms = equation.split("->")[0].split(",")
    if len(terms) != len(ndims):
        raise ValueError(f"einsum: the equation {equation!r} names {len(terms)} operands, got {len(ndims)}")
    lead = _ellipsis_letters(equation, ndims)
    inputs = []
    for term, n in zip(terms, ndims):
        rank = n - len(term.replace("...", ""))
        if rank < 0 or ("..." not in term and rank) or not set(term.replace("...", "")) <= set(LETTERS):
            raise ShapeError(f"einsum: the term {term!r} of {equation!r} does not fit an operand of {n} dims")
        inputs.append(term.replace("...", lead[len(lead) - rank:]))
    if "->" in equation:
        output = equation.split("->")[1].replace("...", lead)
    else:
        letters = "".join(inputs)
        output = lead + "".join(sorted(c for c in set(letters) - set(lead) if letters.count(c) == 1))
    if len(set(output)) < len(output) or not set(output) <= set("".join(inputs)):
        raise ValueError(f"einsum: the output {output!r} of {equation!r} repeats a letter or names one no input has")
    return inputs, output


def _sizes(inputs, arrays):
    """Each letter's size: the longest among the operands (size 1 broadcasts); any other
    disagreement is an error naming the letter."""
    sizes = {}
    for term, x in zip(inputs, arrays):
        for letter, n in zip(term, x.shape):
            old = sizes.setdefault(letter, n)
            if n != old and 1 not in (n, old):
                raise ShapeError(f"einsum: the letter {letter!r} has sizes {old} and {n} "
                                 f"(shapes {[a.shape for a in arrays]})")
            sizes[letter] = n if old == 1 else old
    return sizes


def _onto(grad, letters, term, shape):
    """The gradient `grad` over the distinct `letters` of `term` written into an array of
    operand shape `shape`: broadcast dims summed back to 1, repeated letters onto the diagonal."""
    kept = tuple(i for i, (letter, n) in enumerate(zip(letters, grad.shape))
                 if shape[term.index(letter)] == 1 and n != 1)
    grad = grad.sum(axis=kept, keepdims=True) if kept else grad
    if len(letters) == len(term):
        return grad.transpose([letters.index(c) for c in term])
    out = np.zeros(shape, grad.dtype)
    grids = np.ogrid[tuple(slice(n) for n in grad.shape)]
    out[tuple(grids[letters.index(c)] for c in term)] = grad
    return out


class Einsum(Function):
    """y = einsum(inputs -> output) of the operands; dx_k by the einsum of dy with the others
    (module docstring)."""

    def forward(self, *arrays, inputs, output):
        self.save_for_backward(*arrays)
        self.terms, self.output = inputs, output
        return np.asarray(np.einsum(f"{','.join(inputs)}->{output}", *arrays))

    def backward(self, grad):
        arrays, inputs = self.saved, self.terms
        sizes = _sizes(inputs, arrays)
        grads = []
        for k, (term, x) in enumerate(zip(inputs, arrays)):
            others = [j for j in range(len(arrays)) if j != k]
            seen = self.output + "".join(inputs[j] for j in others)
            letters = "".join(dict.fromkeys(term))  # distinct, in order
            reached = "".join(c for c in letters if c in seen)
            g = np.einsum(f"{','.join([self.output] + [inputs[j] for j in others])}->{reached}",
                          grad, *(arrays[j] for j in others))
            dims = iter(g.shape)  # a letter only this operand has gets a dim of 1, then broadcasts
            g = np.broadcast_to(g.reshape([next(dims) if c in reached else 1 for c in letters]),
                                [sizes[c] for c in letters])
            grads.append(_onto(g, letters, term, x.shape))
        return tuple(grads)


def einsum(equation, *operands):
    """The sum of products `equation` names (`"ij,jk->ik"` is a matmul, `"ii"` a trace,
    `"bi,bi->b"` a batched dot), as `torch.einsum`; operands may also come as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError(f"einsum: {equation!r} needs at least one operand")
    tensors = promoted("einsum", *operands)
    inputs, output = explicit(equation, [t.ndim for t in tensors])
    for term, t in zip(inputs, tensors):
        for letter in set(term):
            sides = {n for c, n in zip(term, t.shape) if c == letter}
            if len(sides) > 1:
                raise ShapeError(f"einsum: the repeated letter {letter!r} of {term!r} spans dims of sizes "
                                 f"{sorted(sides)} in {t.shape}")
    _sizes(inputs, [t.data for t in tensors])
    return Einsum.apply(*tensors, inputs=tuple(inputs), output=output)
