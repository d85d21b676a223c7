"""Chapter 16, parts 2 and 4: the ring, step by step, then for real; the 4D grid.

    python tutorials/16_context_parallel/ring.py --threads 4
    mpiexec -n 4 python -m mpi4py tutorials/16_context_parallel/ring.py

Prints: for cp = the number of ranks and the zigzag layout, which K/V block every rank
holds at every ring step and which of its chunk pairs it computes (past, diagonal) or
skips (future); then ring attention over all ranks next to full attention (largest
differences of the output and of the q, k, v gradients), the K/V bytes each rank sent,
counted next to the formula; then, with 4 ranks, a cp 2 x tp 2 GPT's picture of the rank
grid and its training step next to one device (loss and largest gradient difference).
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from minitensor.nn import functional as F
from minitensor.tensor import Tensor
from parallel import HybridGPT, Mesh
from parallel.context_parallel import ContextParallel, RingAttention, ring_elements
from parallel.context_parallel.layout import causal_relation, rank_chunks
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments

BATCH, HEADS, D = 2, 2, 4


def ring_steps(cp, layout, say):
    say(f"the ring, cp = {cp}, {layout}: rank r holds chunks {[rank_chunks(r, cp, layout) for r in range(cp)]}")
    for step in range(cp):
        say(f"step {step}:")
        for rank in range(cp):
            source = (rank - step) % cp
            relations = [causal_relation(q, k) for q in rank_chunks(rank, cp, layout)
                         for k in rank_chunks(source, cp, layout)]
            counts = {r: relations.count(r) for r in ("past", "diagonal", "future")}
            send = f"; sends it on to rank {(rank + 1) % cp}" if step < cp - 1 else ""
            say(f"  rank {rank} holds K/V of rank {source}: computes {counts['past']} past + "
                f"{counts['diagonal']} diagonal chunk pair(s), skips {counts['future']} future{send}")


def ring_against_full(world, say):
    seq = 4 * world.size
    rng = np.random.default_rng(3)  # the same arrays on every rank: each takes its own tokens
    q, k, v, dout = (rng.standard_normal((BATCH, HEADS, seq, D)) for _ in range(4))
    full = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
    expected = F.scaled_dot_product_attention(*full, causal=True)
    expected.backward(dout)
    context = ContextParallel(world, "zigzag")
    mine = context.indices(seq)
    local = [Tensor(np.ascontiguousarray(a[:, :, mine]), requires_grad=True) for a in (q, k, v)]
    world.reset_stats()
    out = RingAttention.apply(*local, context=context, causal=True)
    out.backward(np.ascontiguousarray(dout[:, :, mine]))
    diffs = [np.abs(got - want[:, :, mine]).max() for got, want in
             zip([out.data] + [t.grad for t in local], [expected.data] + [t.grad for t in full])]
    worst = world.all_reduce(np.array(diffs), op="max")
    say(f"\nring attention on {world.size} rank(s), sequence {seq}, causal, zigzag:")
    say("ring vs full attention, largest difference of output, dq, dk, dv: "
        + ", ".join(f"{d:.1e}" for d in worst))
    sent = world.stats().get("send", {"bytes": 0})["bytes"]
    formula = sum(ring_elements(BATCH, seq, HEADS * D, world.size).values()) * 8
    say(f"K/V bytes rank 0 sent around the ring, forward + backward (counted | formula): {sent} | {formula}")


def four_d(world, say):
    """cp 2 x tp 2: the rank grid and one training step against one device."""
    config = GPTConfig(vocab_size=16, block_size=16, n_layer=2, n_head=4, d_model=16)
    rng = np.random.default_rng(4)
    idx, targets = (rng.integers(0, config.vocab_size, (2, 16)) for _ in range(2))
    mt.manual_seed(0)
    dense = GPT(config).double()
    _, loss = dense(idx, targets)
    loss.backward()
    mt.manual_seed(0)
    model = HybridGPT(GPT(config).double(), Mesh(tp=2, cp=2, world=world))
    say("\n" + model.mesh.describe().rsplit("\n", 1)[0])
    parallel_loss = model.train_step(idx, targets)
    grads = model.full_grads()
    # relative to each gradient's largest entry, or to 1e-6 of the largest of all where a gradient is
    # zero in exact arithmetic (the key bias: softmax ignores a shift shared by all keys), as --check does
    floor = 1e-6 * max(float(np.abs(p.grad).max()) for p in dense.parameters())
    worst = max(float(np.abs(grads[name] - p.grad).max()) / max(float(np.abs(p.grad).max()), floor)
                for name, p in dense.named_parameters())
    say(f"cp 2 x tp 2 train step vs one device: loss difference {abs(parallel_loss - loss.item()):.1e}, "
        f"largest relative gradient difference {worst:.1e}")


def main():
    world = parallel.world()
    say = print if world.rank == 0 else (lambda *args: None)
    ring_steps(world.size, "zigzag", say)
    ring_against_full(world, say)
    if world.size == 4:
        four_d(world, say)


if __name__ == "__main__":
    args = rank_arguments(__doc__.split("\n")[0], default_threads=4).parse_args()
    run_on_ranks(args.threads, main)
