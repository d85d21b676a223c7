"""Chapter 18, part 1: trace a GPT's forward + loss into a graph, run it, differentiate it, draw it.

    python tutorials/18_operator_graphs/trace_and_draw.py [--out DIR]

Prints the graph's table (one attention block's rows and the totals), checks that the
graph's outputs and gradients are bitwise the eager model's, and writes graph.dot (and
graph.png when Graphviz's `dot` is installed) into DIR (default: a temporary folder).
"""
import argparse
import tempfile
from pathlib import Path

import numpy as np

import minitensor as mt
from minitensor import graph
from minitensor.graph.graph_module import render_png
from minitensor.models.gpt import GPT, GPTConfig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for graph.dot / graph.png (default: a temporary one)")
    args = parser.parse_args(argv)
    mt.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=16)
    model = GPT(config, dtype=mt.float64)
    rng = np.random.default_rng(0)
    idx, targets = (rng.integers(0, config.vocab_size, (4, 16)) for _ in range(2))

    gm = graph.trace(model.forward, idx, targets)
    lines = gm.graph.table().splitlines()
    first_block = [k for k, line in enumerate(lines) if line.startswith("blocks.1")][0]
    print("the traced graph of a 2-layer GPT, forward + loss (block 0's rows, then the totals):")
    print("\n".join(lines[:first_block] + ["  ..."] + lines[-2:]))

    logits, loss = model(idx, targets)
    loss.backward()
    eager = {name: p.grad.copy() for name, p in model.named_parameters()}
    model.zero_grad()
    g_logits, g_loss = gm(idx, targets)
    g_loss.backward()
    same = [p.grad.tobytes() == eager[name].tobytes() for name, p in model.named_parameters()]
    print(f"\ngraph vs eager: logits bitwise equal: {g_logits.data.tobytes() == logits.data.tobytes()}, "
          f"loss bitwise equal: {g_loss.data.tobytes() == loss.data.tobytes()}")
    print(f"parameters whose gradient is bitwise the eager one: {sum(same)} of {len(same)}")

    out = Path(args.out or tempfile.mkdtemp(prefix="ch18_"))
    out.mkdir(parents=True, exist_ok=True)
    dot = gm.to_dot()
    (out / "graph.dot").write_text(dot)
    drawn = render_png(dot, out / "graph.png")
    print(f"\nDOT: {dot.count('shape=box')} op boxes, {dot.count('->')} edges written to {out / 'graph.dot'}; "
          + (f"PNG: {out / 'graph.png'}" if drawn else "PNG: not drawn (Graphviz's `dot` is not installed)"))


if __name__ == "__main__":
    main()
