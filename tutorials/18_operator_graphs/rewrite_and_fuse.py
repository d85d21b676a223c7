"""Chapter 18, part 2: rewrite a naive transformer block pass by pass and watch the bytes fall.

    python tutorials/18_operator_graphs/rewrite_and_fuse.py [--gpt medium|small|none]

The block is written op by op, as much code is: each projection normalises x again, the
1/√d scale, the causal mask and the softmax are three ops. After each pass of
`minitensor.graph.passes.DEFAULT_PASSES` it prints the graph's nodes, bytes moved and
saved-activation bytes, and the largest relative difference of the output and of every
gradient (x and the parameters) to the unrewritten graph, in float64. Then the same
totals before -> after for the benchmark's GPT (`--gpt`), whose code is already fused by
hand (its Softmax takes the scale and the mask), so less is left to find there.
"""
import argparse
import math
from collections import Counter

import numpy as np

import minitensor as mt
from minitensor import graph, nn
from minitensor.bench_timing import CONFIGS, random_batch
from minitensor.graph.passes import DEFAULT_PASSES
from minitensor.models.gpt import GPT, merge_heads, split_heads
from minitensor.nn import functional as F


class NaiveBlock(nn.Module):
    """x + attn(LN(x)), then + mlp(LN(x)); attention written op by op."""

    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d, dtype=mt.float64), nn.LayerNorm(d, dtype=mt.float64)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d, dtype=mt.float64) for _ in range(4))
        self.fc, self.fc_proj = nn.Linear(d, 4 * d, dtype=mt.float64), nn.Linear(4 * d, d, dtype=mt.float64)

    def forward(self, x):
        q, k, v = (split_heads(layer(self.ln_1(x)), self.n_head) for layer in (self.q, self.k, self.v))
        t, d_head = x.shape[1], q.shape[-1]
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(d_head))
        scores = mt.masked_fill(scores, np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf)
        x = x + self.proj(merge_heads(F.softmax(scores) @ v))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


def run(gm, x, upstream, params):
    """The output and every gradient (x first) for backward of sum(output · upstream)."""
    for t in (x, *params):
        t.grad = None
    out = gm(x)
    (out * upstream).sum().backward()
    return out.data.copy(), [t.grad.copy() for t in (x, *params)]


def relative(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def print_totals(label, g):
    t = g.totals()
    print(f"{label:<38} nodes {t['nodes']:>3}  bytes moved {t['bytes_moved']:>12,}  saved bytes {t['saved_bytes']:>11,}")


def naive_block_passes():
    mt.manual_seed(0)
    block = NaiveBlock(d=32, n_head=4)
    rng = np.random.default_rng(0)
    x = mt.tensor(rng.standard_normal((4, 32, 32)), requires_grad=True)  # 128 tokens > 3·32: qkv fuses
    upstream = rng.standard_normal((4, 32, 32))
    params = block.parameters()
    gm = graph.trace(block.forward, x)
    reference = run(gm, x, upstream, params)
    print("a naive transformer block (B 4, T 32, d 32, 4 heads, float64), pass by pass:")
    print_totals("traced", gm.graph)
    first = gm.graph.totals()
    for rewrite in DEFAULT_PASSES:
        gm = gm.transform(rewrite)
        out, grads = run(gm, x, upstream, params)
        print_totals(f"after {rewrite.__name__}", gm.graph)
        print(f"{'':<38} largest relative difference: output {relative(out, reference[0]):.1e}, "
              f"gradients {max(relative(g, r) for g, r in zip(grads, reference[1])):.1e}")
    last = gm.graph.totals()
    print("ops now: " + ", ".join(f"{op} {n}" for op, n in sorted(Counter(
        n.op for n in gm.graph.nodes if n.op not in ("input", "param", "constant")).items())))
    print(f"naive block: bytes moved {last['bytes_moved'] / first['bytes_moved']:.3f}x, "
          f"saved bytes {last['saved_bytes'] / first['saved_bytes']:.3f}x, nodes {first['nodes']} -> {last['nodes']}")


def gpt_totals(name):
    config, batch = CONFIGS[name]
    mt.manual_seed(0)
    model = GPT(config)
    gm = graph.trace(model.forward, *random_batch(config, batch))
    print(f"\nthe {name} GPT (batch {batch}, T {config.block_size}, d {config.d_model}, float32), all passes:")
    print_totals("traced", gm.graph)
    after = gm.transform(*DEFAULT_PASSES).graph
    print_totals("after all passes", after)
    before, now = gm.graph.totals(), after.totals()
    print(f"{name} GPT: bytes moved {now['bytes_moved'] / before['bytes_moved']:.3f}x, "
          f"saved bytes {now['saved_bytes'] / before['saved_bytes']:.3f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt", default="medium", choices=[*CONFIGS, "none"], help="the GPT to total (none: skip)")
    args = parser.parse_args(argv)
    naive_block_passes()
    if args.gpt != "none":
        gpt_totals(args.gpt)


if __name__ == "__main__":
    main()
