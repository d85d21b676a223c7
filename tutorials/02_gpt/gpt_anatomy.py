"""Chapter 2, part 1: every layer of the GPT, its parameters and its forward FLOPs, counted two ways.

    python tutorials/02_gpt/gpt_anatomy.py [--n-layer 2 --n-head 4 --d-model 128 --batch 64]

The default model has the shape of the one train_addition.py trains (the sizes of
minitensor.data.recommended_config(), on its 2-digit addition task), with freshly
initialised weights: it trains nothing, since parameter and FLOP counts do not depend
on the weights' values. Each module is run on a fresh leaf input, so minitensor.graph
counts the FLOPs of that module alone; the totals are then compared with the
closed-form counts.
"""
import argparse

import numpy as np

import minitensor as mt
from minitensor import graph
from minitensor.data import AdditionTask, recommended_config
from minitensor.models.gpt import GPT, GPTConfig


def params_of(module):
    return sum(p.size for p in module.parameters())


def forward_flops(module, x):
    """FLOPs of module(x) alone: x is a fresh leaf, so the graph starts at this module."""
    leaf = mt.Tensor(x.data, requires_grad=True)
    return graph.totals(module(leaf))["flops"]


def rows_for(model, idx, targets):
    """(name, parameters, forward FLOPs) per module, in the order forward runs them."""
    rows = []
    x = model.embed(idx)
    embed_flops = graph.totals(x)["flops"] if x.requires_grad else 0
    rows.append(("tok_emb + pos_emb", params_of(model.tok_emb) + params_of(model.pos_emb), embed_flops))
    for i, block in enumerate(model.blocks):
        h = block.ln_1(x)
        a = x + block.attn(h)
        for name, module, inp in (("ln_1", block.ln_1, x), ("attn (q, k, v, softmax, proj)", block.attn, h),
                                  ("ln_2", block.ln_2, a), ("mlp (fc, gelu, proj)", block.mlp, block.ln_2(a))):
            rows.append((f"blocks.{i}.{name}", params_of(module), forward_flops(module, inp)))
        rows.append((f"blocks.{i} residual adds (2 of them)", 0, 2 * forward_flops(lambda t: t + t, x)))
        x = block(x)
    leaf = mt.Tensor(x.data, requires_grad=True)
    rows.append(("ln_f + lm_head + cross-entropy", params_of(model.ln_f) + params_of(model.lm_head),
                 graph.totals(model.head(leaf, targets)[1])["flops"]))
    return rows


def main(args):
    task = AdditionTask(digits=args.digits)
    cfg = GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, d_model=args.d_model)
    mt.manual_seed(0)
    model = GPT(cfg)
    idx, targets = task.get_batch(args.batch, generator=np.random.default_rng(0))
    B, T = idx.shape
    V, L, d = cfg.vocab_size, cfg.n_layer, cfg.d_model
    print(f"GPT {cfg}\nbatch {B} sequences x {T} tokens = {B * T} tokens\n")

    rows = rows_for(model, idx, targets)
    print(f"{'module':<40} {'parameters':>11} {'forward FLOPs':>15}")
    for name, n, f in rows:
        print(f"{name:<40} {n:>11,} {f:>15,}")
    n_counted, f_counted = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{'total':<40} {n_counted:>11,} {f_counted:>15,}\n")

    # Closed forms. Per block: q, k, v, proj are d×d + d; fc is d×4d + 4d; proj 4d×d + d; 2 LayerNorms 2d each.
    n_formula = V * d + cfg.block_size * d + L * (12 * d * d + 13 * d) + 2 * d + V * d
    print(f"parameters counted: {n_counted:,}")
    print(f"parameters by formula V·d + T·d + L·(12d² + 13d) + 2d + V·d: {n_formula:,}")

    _, loss = model(idx, targets)
    table = graph.ops_table(loss)
    matmul = sum(r["flops"] for r in table if r["op"] in ("Linear", "MatMul"))
    # Each weight does 2 FLOPs per token; attention adds q·kᵀ and weights·v: 2·B·T²·d each, per layer.
    matmul_formula = 2 * B * T * (12 * L * d * d + V * d) + 4 * L * B * T * T * d
    whole = graph.totals(loss)["flops"]
    print(f"matmul FLOPs of the whole forward (graph): {matmul:,}")
    print(f"matmul FLOPs by formula 2·tokens·(12·L·d² + V·d) + 4·L·B·T²·d: {matmul_formula:,}")
    print(f"whole forward FLOPs (graph): {whole:,}; matmuls are {100 * matmul / whole:.1f}% of them")
    print(f"the same total as the per-module sum above: {whole == f_counted}")
    print(f"a training step (backward ≈ 2 × forward): ≈ {3 * whole:,} FLOPs, "
          f"close to the 6·N·tokens rule\n(N = parameters outside the embeddings): {6 * (n_counted - V * d - cfg.block_size * d) * B * T:,}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    recipe = recommended_config()
    for flag in ("digits", "n_layer", "n_head", "d_model"):
        parser.add_argument("--" + flag.replace("_", "-"), type=int, default=recipe[flag])
    parser.add_argument("--batch", type=int, default=64)
    main(parser.parse_args())
