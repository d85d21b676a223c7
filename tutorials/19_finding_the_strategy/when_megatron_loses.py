"""Two machines where the search does not pick Megatron's split, and why it is right there.

    python tutorials/19_finding_the_strategy/when_megatron_loses.py

1. Many tokens through a narrow block (d_model 32, 512 sequences of 64 tokens): one
   activation is 4 MiB, all the block's weights 48 KiB. Megatron all-reduces activations
   (four per block); splitting the batch instead moves each activation once per direction
   (gather the output, the input's gradient) and all-reduces only the weights' gradients.
2. A link with α = 50 ms per message (a slow network, or a tiny model): every collective
   costs more than the compute it would save, so the block runs whole on every rank.
Each case prints the searched plan's seconds next to Megatron's split priced by the same
model (plan.evaluate), so the choice can be checked by hand.
"""
from parallel.plan import GPTConfig
from parallel.plan.auto import Machine, auto_shard, block_graph, split

COLUMN, ROW = ("attn.q", "attn.k", "attn.v", "mlp.fc"), ("attn.proj", "mlp.proj")


def megatron(graph, machine):
    """Megatron-LM's split priced by the same cost model: q, k, v and fc column-parallel, the
    projections row-parallel, the rest as cheap as the search can make it around them."""
    fixed = {f"{name}.weight": split(0) for name in COLUMN} | {f"{name}.weight": split(1) for name in ROW}
    return auto_shard(graph, machine, fixed=fixed)


def compare(title, graph, machine):
    plan, reference = auto_shard(graph, machine), megatron(graph, machine)
    print(f"\n=== {title} ===")
    print(plan.summary())
    kinds = sorted({f"{c.direction} {c.kind} of {'weights' if c.value.endswith(('weight', 'bias')) else 'activations'}"
                    for c in plan.collectives})
    print("moves: " + ("; ".join(kinds) if kinds else "nothing"))
    split_weights = sorted(name for name, layout in plan.layouts.items() if name.endswith("weight") and layout != "R")
    print(f"weights split: {', '.join(split_weights) or 'none'}")
    print(f"searched {plan.seconds:.4g} s, Megatron's split {reference.seconds:.4g} s: "
          f"Megatron / searched = {reference.seconds / plan.seconds:.3g}")
    return plan


def main():
    narrow = GPTConfig(vocab_size=64, block_size=64, n_layer=1, n_head=2, d_model=32)
    graph = block_graph(narrow, 512)
    plan = compare("many tokens, narrow block: 512 × 64 tokens of width 32, tp 2", graph,
                   Machine.from_profile("laptop-cpu", 2, "float32"))
    first = graph.of_op("Linear")[0].name
    print(f"the first projection's output is laid out {plan.layouts[first]} (dimension 0 = the sequences)")

    medium = GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512)
    laptop = Machine.from_profile("laptop-cpu", 2, "float32")
    compare("medium block, α = 50 ms per message, tp 2", block_graph(medium, 1),
            Machine(2, 0.05, laptop.beta, laptop.rate))


if __name__ == "__main__":
    main()
