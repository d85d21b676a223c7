"""Chapter 15, part 2: the dynamic loss scaler at work, the same on every rank.

    python tutorials/15_mixed_precision/scaler_trajectory.py --threads 4      (dp 2 x tp 2)
    mpiexec -n 4 python -m mpi4py tutorials/15_mixed_precision/scaler_trajectory.py

Trains a small GPT under the fp16 policy with a scale that starts far too high (2^24)
and grows every 4 clean steps, so it overflows, backs off, grows and overflows again.
At step 14 one rank (the last tp rank of dp rank 1) alone gets an inf in a gradient. Prints
each step's scale and whether it was skipped, and checks that every rank holds the
same trajectory: the found-inf flag is MAX-all-reduced over tp, pp and dp.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import parallel
import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from parallel import HybridGPT, Mesh
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments

CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, d_model=32)
STEPS, INJECT_AT = 16, 14


def main():
    np.seterr(over="ignore", invalid="ignore")  # the overflows are the point: the scaler counts them
    world = parallel.world()
    mt.manual_seed(0)
    model = HybridGPT(GPT(CONFIG), Mesh(2, world.size // 2, 1), precision="fp16",
                      scaler=dict(init_scale=2.0**24, growth_interval=4))
    model.configure_optimizer(lr=1e-3)
    rng = np.random.default_rng(0)
    trajectory = []
    for step in range(1, STEPS + 1):
        idx = rng.integers(0, 11, (8, 8))
        loss = model.train_step(idx, np.roll(idx, -1, axis=1))
        if step == INJECT_AT and (model.mesh.dp_rank, model.mesh.tp_rank) == (1, model.mesh.tp - 1):
            next(p for p in model.parameters() if p.grad is not None).grad.flat[0] = np.inf
        scale, skipped = model.amp.scaler.scale, model.amp.skipped
        model.optimizer_step()
        trajectory.append((step, scale, model.amp.skipped > skipped, loss))
    mine = np.array([[s, float(k)] for _, s, k, _ in trajectory])
    everyone = world.all_gather(mine).reshape(world.size, *mine.shape)
    if world.rank == 0:
        for step, scale, skipped, loss in trajectory:
            print(f"step {step:>2}: loss scale 2^{np.log2(scale):<3g} {'skipped (inf/nan gradient)' if skipped else 'stepped'}"
                  f"  loss {loss:.4f}")
        same = sum(np.array_equal(everyone[r], everyone[0]) for r in range(world.size))
        print(f"ranks with the same scale trajectory and skips: {same} of {world.size}")
        print(f"skipped steps: {model.amp.skipped}; final scale 2^{np.log2(model.amp.scaler.scale):g}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=4)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
