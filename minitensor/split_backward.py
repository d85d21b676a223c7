"""A backward pass in two halves: B (input gradients, now) and W (weight gradients, later).

In a pipeline the previous stage waits for the gradient of this stage's input; nobody
waits for the gradients of its weights. So the backward of one micro-batch can run as
two calls, with other work in between:

    weights = backward_input(loss, inputs=[x])   # B: x.grad and every gradient on the way to it
    ...                                          #    (the next micro-batch's forward, say)
    weights()                                    # W: every weight's .grad

For y = x·Wᵀ (Linear; MatMul alike) the two halves are independent products of arrays
the forward already saved:

    B:  dx = dy·W          W:  dW = dyᵀ·x,  db = Σ dy

so nothing is recomputed. W keeps the node (its saved x and W) and the dy that B handed
to it; that is what a micro-batch still holds between its B and its W. These are the
matrix products of a linear layer's backward, which is why B and W each cost about one
forward (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).

Which leaves are weights: every leaf that requires grad and is not one of `inputs`. A
node splits if it defines `backward_parts(grad, wanted)` (Linear, MatMul). Any other node
runs its whole backward in B, and its weight gradients (layer norm's dw and db, the
embedding's rows; cheap next to the GEMMs) wait, already computed, for W.

Equality: W visits the nodes in the order B did and sums each weight's contributions in
that order before adding the sum to `.grad`, exactly as one full backward does, and each
contribution is the same product. So B then W gives bitwise the gradients of backward().
"""
import numpy as np

from minitensor.autograd import check_grad, node_gradients, run_backward
from minitensor.graph import saved_arrays


class WeightGradients:
    """The W half of one split backward; calling it runs W (once)."""

    def __init__(self, inputs):
        self.inputs = {id(t) for t in inputs}
        self.parts = []  # per node reached in B: (node, which inputs are weights, dy, or its computed grads)

    def is_weight(self, tensor):
        return tensor._node is None and tensor.requires_grad and id(tensor) not in self.inputs

    def split(self, node, grad):
        """B at one node: the gradients of its other inputs now; its weights' part is kept."""
        weights = tuple(self.is_weight(t) for t in node.inputs)
        if not any(weights):
            return node_gradients(node, grad)
        if hasattr(node, "backward_parts"):
            self.parts.append((node, weights, grad, None))
            return node.backward_parts(grad, tuple(t.requires_grad and not w for t, w in zip(node.inputs, weights)))
        grads = node_gradients(node, grad)
        self.parts.append((node, weights, None, grads))
        return tuple(None if w else g for g, w in zip(grads, weights))

    def __call__(self):
        """W: the deferred products, each weight's contributions summed in B's order, into `.grad`."""
        pending, leaves = {}, {}
        for node, weights, grad, grads in self.parts:
            if grads is None:
                grads = node.backward_parts(grad, weights)
            for tensor, g, is_weight in zip(node.inputs, grads, weights):
                if not is_weight or g is None:
                    continue
                check_grad(tensor, g, node.name)
                key = id(tensor)
                pending[key] = g if key not in pending else pending[key] + g
                leaves[key] = tensor
        self.parts = []  # frees what B kept alive
        for key, tensor in leaves.items():
            tensor._accumulate_grad(pending[key])

    def saved_bytes(self):
        """Bytes kept alive until W: the splitting nodes' saved arrays and dy, the gradients
        already computed; the weights themselves are model state and are left out."""
        weights = {id(t.data) for node, *_ in self.parts for t in node.inputs if self.is_weight(t)}
        arrays = [a for node, _, grad, grads in self.parts
                  for a in (saved_arrays(node) + [grad] if grads is None else list(grads))]
        unique = {id(a): a for a in arrays if isinstance(a, np.ndarray) and id(a) not in weights}
        return sum(a.nbytes for a in unique.values())


def backward_input(tensor, grad=None, inputs=()):
    """B: backpropagate from `tensor` (a scalar when `grad` is None), accumulating the
    gradients of `inputs`; every other leaf's gradient waits in the returned
    `WeightGradients`, whose call is W. The graph is released as by backward()."""
    if grad is None:
        if tensor.size != 1:
            raise RuntimeError(f"backward_input() without a gradient needs a scalar output; "
                               f"this tensor has shape {tensor.shape}")
        grad = np.ones_like(tensor.data)
    grad = np.asarray(grad, dtype=tensor.dtype)
    check_grad(tensor, grad, "backward_input()")
    weights = WeightGradients(inputs)
    run_backward(tensor, grad, weights=weights)
    return weights


class WeightGradStore:
    """Deferred W halves by key (a pipeline uses (micro-batch, chunk)): `put` after B,
    `run` at the schedule's W."""

    def __init__(self):
        self.pending = {}

    def put(self, key, weights):
        if key in self.pending:
            raise RuntimeError(f"the weight gradients of {key} are already waiting for their W")
        self.pending[key] = weights

    def run(self, key):
        if key not in self.pending:
            raise RuntimeError(f"W of {key} before its B: no weight gradients are waiting")
        self.pending.pop(key)()

    def __len__(self):
        return len(self.pending)
