"""Chapter 1, part 1: write a Function, see the graph it builds, and watch backward walk it.

    python tutorials/01_autograd/function_and_walk.py

Prints the forward graph of  loss = softplus(x @ w + b).sum()  in topological
order, the order backward visits it, and the largest difference between
autograd's gradients and the ones derived by hand.
"""
import numpy as np

import minitensor as mt
from minitensor.autograd import topological_order


class Softplus(mt.Function):
    """softplus(x) = log(1 + eˣ);  d/dx softplus(x) = eˣ / (1 + eˣ) = sigmoid(x)."""

    def forward(self, x):
        self.save_for_backward(x)
        return np.logaddexp(0.0, x)  # log(e⁰ + eˣ), without overflow for large x

    def backward(self, grad):
        (x,) = self.saved
        return grad * sigmoid(x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def describe(tensor, names):
    """'MatMul(x, w) -> (4, 3)' for an op, 'x (4, 5) leaf' for a leaf."""
    if tensor._node is None:
        return f"{names.get(id(tensor), 'leaf')} {tensor.shape} leaf"
    inputs = ", ".join(names.get(id(t), t._node.name if t._node else "leaf") for t in tensor._node.inputs)
    return f"{tensor._node.name}({inputs}) -> {tensor.shape}"


def main():
    rng = np.random.default_rng(0)
    x = mt.Tensor(rng.standard_normal((4, 5)))  # data: no gradient wanted
    w = mt.Tensor(rng.standard_normal((5, 3)), requires_grad=True)
    b = mt.Tensor(rng.standard_normal(3), requires_grad=True)

    z = x @ w + b
    loss = Softplus.apply(z).sum()
    names = {id(x): "x", id(w): "w", id(b): "b"}

    order = topological_order(loss)
    print("the graph, inputs first (topological order):")
    for i, t in enumerate(order):
        print(f"  {i}: {describe(t, names)}")
    print("x is not in the walk: it does not require grad, so backward never goes there")
    print("backward visits: " + " -> ".join(t._node.name if t._node else names[id(t)] for t in reversed(order)))

    loss.backward()

    # By hand: dloss/dz = sigmoid(z); z = x @ w + b, so dw = xᵀ·sigmoid(z) and db = Σ_rows sigmoid(z).
    dz = sigmoid(x.data @ w.data + b.data)
    diff = max(np.abs(w.grad - x.data.T @ dz).max(), np.abs(b.grad - dz.sum(axis=0)).max())
    print(f"largest difference autograd vs hand-derived gradient: {diff:.1e}")

    # A tensor used twice gets the SUM of both paths: d(a·a + a)/da = 2a + 1.
    a = mt.Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    (a * a + a).sum().backward()
    print(f"a = {a.data}, grad of sum(a*a + a) = {a.grad}  (2a + 1 = {2 * a.data + 1})")
    print(f"largest difference for the tensor used twice: {np.abs(a.grad - (2 * a.data + 1)).max():.1e}")

    try:
        loss.backward()
    except RuntimeError as error:
        print(f"a second backward() raises RuntimeError: {str(error).split(':')[0]}")


if __name__ == "__main__":
    main()
