"""Chapter 1, part 2: check a backward against central differences, and look at a graph.

    python tutorials/01_autograd/gradcheck_and_graph.py [--dot graph.dot]

Prints one derivative estimated by hand with central differences, gradcheck
passing on Softplus and failing on a backward that is 1% off, then the FLOPs
and saved-memory table of a small MLP's loss and its Graphviz DOT text.
"""
import argparse

import numpy as np

import minitensor as mt
from minitensor import graph
from minitensor.nn import functional as F
from function_and_walk import Softplus, sigmoid


class SoftplusOnePercentOff(Softplus):
    """The kind of bug gradcheck exists for: a derivative that is almost right."""

    def backward(self, grad):
        return 1.01 * super().backward(grad)


def central_difference_by_hand(x, i, eps=1e-6):
    """d softplus(xᵢ)/dxᵢ ≈ (f(xᵢ + ε) − f(xᵢ − ε)) / 2ε, the estimate gradcheck makes for every element."""
    plus, minus = x.copy(), x.copy()
    plus[i] += eps
    minus[i] -= eps
    f = lambda v: Softplus.apply(mt.Tensor(v)).data[i]
    return (f(plus) - f(minus)) / (2 * eps)


def mlp_loss(rng):
    """A two-layer MLP's cross-entropy on 8 random examples, the graph we print, and its
    weights by name (to_dot labels those leaves with them)."""
    x = mt.Tensor(rng.standard_normal((8, 16)))
    w1 = mt.Tensor(rng.standard_normal((16, 32)) * 0.1, requires_grad=True)
    w2 = mt.Tensor(rng.standard_normal((32, 10)) * 0.1, requires_grad=True)
    targets = rng.integers(0, 10, size=8)
    return F.cross_entropy((x @ w1).relu() @ w2, targets), {"w1": w1, "w2": w2}


def main(args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(6)
    estimate = central_difference_by_hand(x, 2)
    print(f"d softplus/dx at x = {x[2]:.4f}: central difference {estimate:.10f}, sigmoid(x) {sigmoid(x[2]):.10f}")
    print(f"difference of one central-difference estimate: {abs(estimate - sigmoid(x[2])):.1e}")

    xt = mt.Tensor(rng.standard_normal((3, 4)), requires_grad=True)
    print(f"gradcheck(Softplus) on a (3, 4) input: passed = {mt.gradcheck(Softplus.apply, xt)}")
    try:
        mt.gradcheck(SoftplusOnePercentOff.apply, xt)
    except AssertionError as error:
        print(f"gradcheck(SoftplusOnePercentOff) raised AssertionError: {error}")

    loss, weights = mlp_loss(rng)
    print("\nthe graph of a two-layer MLP's loss (graph.summary, before backward):")
    graph.summary(loss)
    total = graph.totals(loss)
    print(f"forward FLOPs: {total['flops']:,} (the two matmuls alone: 2·8·16·32 + 2·8·32·10 = "
          f"{2 * 8 * 16 * 32 + 2 * 8 * 32 * 10:,})")
    dot = graph.to_dot(loss, params=weights)
    if args.dot:
        with open(args.dot, "w") as f:
            f.write(dot)
        print(f"DOT text written to {args.dot}; render it with: dot -Tsvg {args.dot} -o graph.svg")
    else:
        print("graph.to_dot (save with --dot FILE, render with Graphviz):\n" + dot)
    loss.backward()
    print(f"after backward the graph is released; loss = {loss.item():.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dot", help="write the graph's DOT text to this file instead of printing it")
    main(parser.parse_args())
