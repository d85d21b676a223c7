"""Pipeline stage boundaries from measured part times: the DP against every possible cut.

    python tutorials/18_finding_the_strategy/stage_boundaries.py [--pp 3]

A GPT whose head is heavy (a 4096-word vocabulary on d_model 64): its lm_head and loss
take as long as several blocks. Balancing by parameter count (HybridGPT's default) ignores
that the head's matmul runs over every token; balancing by measured time
(`pipeline.partition.balance_by_cost`, a DP minimising the slowest stage) gives the last
stage fewer blocks. The script measures the parts here (parallel/plan/parts.py), runs the
DP, checks it against all cuts, and replays the 1F1B schedule of both balances
(parallel/plan/simulate.py).
"""
import argparse
from itertools import combinations

import numpy as np

from parallel.pipeline.partition import balance_by_cost, balance_by_parameters
from parallel.plan import GPTConfig, Layout, load_profile
from parallel.plan.parts import measure_parts
from parallel.plan.simulate import simulate_step
from parallel.plan.validate_worker import dense_gpt

CONFIG = GPTConfig(vocab_size=4096, block_size=32, n_layer=8, n_head=4, d_model=64)


def stage_seconds(balance, block, first, last):
    """Forward + backward seconds of one micro-batch on each stage."""
    return [count * block + first * (s == 0) + last * (s == len(balance) - 1) for s, count in enumerate(balance)]


def every_balance(n, pp):
    """Every way to cut n blocks into pp contiguous non-empty stages."""
    for cuts in combinations(range(1, n), pp - 1):
        bounds = (0, *cuts, n)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pp", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=4)
    args = parser.parse_args(argv)
    parts = measure_parts(CONFIG, args.micro_batch, 1)
    block, first, last = sum(parts.block), sum(parts.embed), sum(parts.head)
    print(f"{CONFIG}, micro-batch {args.micro_batch}: forward + backward measured here")
    print(f"  embedding {first * 1e3:.3g} ms, one block {block * 1e3:.3g} ms, head + loss {last * 1e3:.3g} ms "
          f"(= {last / block:.2g} blocks)")
    by_time = balance_by_cost([block] * CONFIG.n_layer, args.pp, first, last)
    by_params = balance_by_parameters(dense_gpt(CONFIG), args.pp)
    slowest = {name: max(stage_seconds(b, block, first, last)) for name, b in
               (("time", by_time), ("params", by_params))}
    brute = min(every_balance(CONFIG.n_layer, args.pp), key=lambda b: max(stage_seconds(b, block, first, last)))
    best = max(stage_seconds(brute, block, first, last))
    print(f"balance by measured time (DP): {by_time}, slowest stage {slowest['time'] * 1e3:.4g} ms")
    print(f"balance by parameter count:    {by_params}, slowest stage {slowest['params'] * 1e3:.4g} ms")
    print(f"best of all {sum(1 for _ in every_balance(CONFIG.n_layer, args.pp))} cuts: {brute}, slowest stage "
          f"{best * 1e3:.4g} ms; DP equals it: {'yes' if np.isclose(best, slowest['time']) else 'no'}")
    profile, m = load_profile("laptop-cpu"), 2 * args.pp
    steps = {name: simulate_step(CONFIG, Layout(pp=args.pp, micro_batches=m), args.micro_batch * m, parts, profile,
                                 balance=b).total for name, b in (("time", by_time), ("params", by_params))}
    print(f"1F1B step with m={m} (simulated): by time {steps['time']:.4g} s, by parameters {steps['params']:.4g} s, "
          f"speed-up {steps['params'] / steps['time']:.3g}")


if __name__ == "__main__":
    main()
