"""The sharding search on one traced GPT block rediscovers Megatron-LM's column → row split.

    python tutorials/19_finding_the_strategy/rediscover_megatron.py [--config medium] [--micro-batch 8]

Traces one block of the config (minitensor.graph.trace), searches the cheapest layout of
every value over tp = 2 and 4 ranks of the laptop profile (parallel.plan.auto), and prints
the plan, its collectives, and what the fully replicated block would cost instead.
"""
import argparse

from parallel.plan import get_config
from parallel.plan.auto import REPLICATED, Machine, auto_shard, block_graph, evaluate
from parallel.plan.auto.plan import is_leaf, node_rules


def replicated(graph, machine):
    """Every value on every rank, every op computed whole: no communication at all."""
    ops = {n.name: node_rules(graph, n, machine.tp)[0] for n in graph.nodes if not is_leaf(n)}
    return evaluate(graph, {n.name: REPLICATED for n in graph.nodes if n.op == "param"}, ops, machine)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="medium")
    parser.add_argument("--micro-batch", type=int, default=8)
    args = parser.parse_args(argv)
    config = get_config(args.config)
    graph = block_graph(config, args.micro_batch)
    ops = sum(not is_leaf(n) for n in graph.nodes)
    print(f"one block of {config}: {ops} ops, {len(graph.nodes) - ops} parameters and inputs")
    for tp in (2, 4):
        machine = Machine.from_profile("laptop-cpu", tp, "float32")
        plan = auto_shard(graph, machine)
        print(f"\n=== tp = {tp} ===")
        print(plan.table(graph))
        print(plan.summary())
        weights = {name: plan.layouts[f"{name}.weight"] for name in
                   ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj")}
        print("weights: " + ", ".join(f"{name} {layout}" for name, layout in weights.items()))
        for direction in ("forward", "backward"):
            kinds = [c.kind for c in plan.collectives if c.direction == direction]
            print(f"tp={tp} {direction} all-reduces: {kinds.count('all-reduce')}, other collectives: "
                  f"{len(kinds) - kinds.count('all-reduce')}")
        column = all(weights[n] == "S(0)" for n in ("attn.q", "attn.k", "attn.v", "mlp.fc"))
        row = all(weights[n] == "S(1)" for n in ("attn.proj", "mlp.proj"))
        print(f"tp={tp} Megatron's column → row split: {'yes' if column and row else 'no'}")
        print(f"tp={tp} seconds: searched {plan.seconds:.4g}, replicated {replicated(graph, machine).seconds:.4g}")


if __name__ == "__main__":
    main()
