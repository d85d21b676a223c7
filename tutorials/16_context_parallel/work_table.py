"""Chapter 16, part 3: why the naive causal split idles ranks, counted.

    python tutorials/16_context_parallel/work_table.py

Prints: for cp = 2, 4, 8 and a sequence of 2·cp·256 tokens, the causal attention work of
every rank (unmasked (query, key) pairs, layout.attention_work) under the contiguous and the
zigzag split, and the busiest rank over the mean, next to (2·cp−1)/cp; then a real ring
attention on 4 thread ranks for both layouts, its counted work next to the formula.
"""
import numpy as np

import parallel
from minitensor.tensor import Tensor
from parallel.context_parallel import ContextParallel, RingAttention, attention_work

CHUNK = 256


def table(cp):
    seq = 2 * cp * CHUNK
    print(f"\ncp = {cp}, sequence {seq}: work per rank in thousands of (query, key) pairs")
    for layout in ("contiguous", "zigzag"):
        work = [attention_work(seq, rank, cp, layout) for rank in range(cp)]
        cells = " ".join(f"{w / 1000:7.0f}" for w in work)
        print(f"  {layout:<10} {cells}   busiest / mean {max(work) / np.mean(work):.3f}")
    print(f"  (2·cp−1)/cp = {(2 * cp - 1) / cp:.3f}; zigzag's every rank: {(2 * cp - 1) * CHUNK ** 2} + "
          f"{CHUNK * (CHUNK + 1)} pairs")


def counted(layout, cp=4, seq=64):
    """Run ring attention on cp thread ranks; every rank's counted work."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, seq, 4)) for _ in range(3))

    def rank_fn():
        context = ContextParallel(parallel.world(), layout)
        mine = context.indices(seq)
        RingAttention.apply(*(Tensor(np.ascontiguousarray(a[:, :, mine])) for a in (q, k, v)),
                            context=context, causal=True)
        return context.work
    work = parallel.run_threads(cp, rank_fn, timeout=60)
    formula = [2 * attention_work(seq, rank, cp, layout) for rank in range(cp)]  # x batch 1 x heads 2
    print(f"ring attention on {cp} threads, {layout}, sequence {seq}, 2 heads: counted work per rank "
          f"{work}, formula {formula}; counted equals formula: {work == formula}")


def main():
    for cp in (2, 4, 8):
        table(cp)
    print()
    for layout in ("contiguous", "zigzag"):
        counted(layout)


if __name__ == "__main__":
    main()
