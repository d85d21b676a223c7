"""Pipeline stage boundaries from measured part times: the DP against every possible cut.

    python tutorials/19_finding_the_strategy/stage_boundaries.py [--pp 3]

A GPT whose head is heavy (a 4096-word vocabulary on d_model 64): its lm_head and loss
take as long as several blocks. Balancing by parameter count (HybridGPT's default) ignores
that the head's matmul runs over every token; balancing by measured time
(`pipeline.partition.balance_by_cost`, a DP minimising the slowest stage) gives the last
stage fewer blocks. The script measures the parts here (parallel/plan/parts.py), runs the
DP, checks it against all cuts, and replays the 1F1B schedule of both balances
(parallel/plan/simulate.py).

Robust under load: the cut depends (nearly) only on how many blocks the head weighs, and
the script prints the whole range of that weight over which its cut stays the same (for 8
blocks on 3 stages, [3, 4, 1] from 2 blocks up). Each part is measured in --rounds
interleaved rounds (embedding, block, head, again) and the medians are used, so a burst of
load slows every part alike. The README's reference (a quiet 2-core laptop) prints beside yours.
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
REFERENCE = {"block_ms": 1.6, "head_blocks": 4.6, "by_time": [3, 4, 1]}  # the README's run


def median_parts(config, micro_batch, rounds):
    """(embedding, one block, head + loss) forward + backward seconds: medians over `rounds`
    interleaved measurements (parallel.plan.parts.measure_parts, itself medians of 3)."""
    runs = [measure_parts(config, micro_batch, 1) for _ in range(rounds)]
    return tuple(float(np.median([sum(getattr(parts, name)) for parts in runs])) for name in ("embed", "block", "head"))


def stage_seconds(balance, block, first, last):
    """Forward + backward seconds of one micro-batch on each stage."""
    return [count * block + first * (s == 0) + last * (s == len(balance) - 1) for s, count in enumerate(balance)]


def same_cut_range(balance, block, first, last, pp):
    """(low, high): the head's weight in blocks over which balance_by_cost keeps `balance`
    (embedding and block as measured; high is inf when it holds up to 100 blocks)."""
    weights = np.arange(0.05, 100, 0.05)
    same = [balance_by_cost([block] * CONFIG.n_layer, pp, first, w * block) == balance for w in weights]
    here = int(np.argmin(abs(weights - last / block)))
    low = high = here
    while low > 0 and same[low - 1]:
        low -= 1
    while high < len(weights) - 1 and same[high + 1]:
        high += 1
    return weights[low], (np.inf if high == len(weights) - 1 else weights[high])


def every_balance(n, pp):
    """Every way to cut n blocks into pp contiguous non-empty stages."""
    for cuts in combinations(range(1, n), pp - 1):
        bounds = (0, *cuts, n)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pp", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved measurements, medians (default 5)")
    args = parser.parse_args(argv)
    first, block, last = median_parts(CONFIG, args.micro_batch, args.rounds)
    parts = measure_parts(CONFIG, args.micro_batch, 1)  # the simulated step's per-op costs
    print(f"{CONFIG}, micro-batch {args.micro_batch}: forward + backward measured here "
          f"(medians of {args.rounds} rounds)")
    print(f"  embedding {first * 1e3:.3g} ms, one block {block * 1e3:.3g} ms, head + loss {last * 1e3:.3g} ms "
          f"(= {last / block:.2g} blocks; README: {REFERENCE['block_ms']:.2g} ms a block, head = "
          f"{REFERENCE['head_blocks']:.2g} blocks)")
    by_time = balance_by_cost([block] * CONFIG.n_layer, args.pp, first, last)
    by_params = balance_by_parameters(dense_gpt(CONFIG), args.pp)
    slowest = {name: max(stage_seconds(b, block, first, last)) for name, b in
               (("time", by_time), ("params", by_params))}
    # the slowest stage first, then the next slowest...: among equally slow cuts, the most even
    brute = min(every_balance(CONFIG.n_layer, args.pp),
                key=lambda b: sorted(stage_seconds(b, block, first, last), reverse=True))
    best = max(stage_seconds(brute, block, first, last))
    print(f"balance by measured time (DP): {by_time}, slowest stage {slowest['time'] * 1e3:.4g} ms "
          f"(README: {REFERENCE['by_time']})")
    low, high = same_cut_range(by_time, block, first, last, args.pp)
    print(f"  the same cut for a head of {low:.2g} to {high:.3g} blocks; yours weighs {last / block:.2g}")
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
