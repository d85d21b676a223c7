"""Chapter 4, part 1: data parallelism in ten lines — slice the batch, all-reduce the gradients, divide.

    python tutorials/04_data_parallel/average_gradients.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/04_data_parallel/average_gradients.py

Every rank builds the same float64 GPT (same seed), takes its slice of one
global batch, runs forward and backward, and all-reduces every gradient by
hand. Each rank also runs the whole batch on its own (the one-device
reference) and the script prints the largest difference over every gradient
and every rank.
"""
import parallel
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=32)


def global_batch(size, seed=0):
    """The same (inputs, targets) on every rank: `size` random sequences of 16 tokens."""
    tokens = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, size=(size, CONFIG.block_size + 1))
    return tokens[:, :-1], tokens[:, 1:]


def one_device_gradients(idx, targets):
    """The reference: the whole batch on one model."""
    mt.manual_seed(0)
    model = GPT(CONFIG).double()
    _, loss = model(idx, targets)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


def data_parallel_gradients(group, idx, targets):
    """This rank's slice of the batch, then every gradient summed over the ranks and divided by n."""
    mt.manual_seed(0)
    model = GPT(CONFIG).double()  # same seed: the same replica on every rank
    mine = slice(group.rank * len(idx) // group.size, (group.rank + 1) * len(idx) // group.size)
    _, loss = model(idx[mine], targets[mine])
    loss.backward()
    for p in model.parameters():
        group.all_reduce(p.grad)  # sum over ranks, in place
        p.grad /= group.size  # the mean of per-rank mean losses is the global mean loss
    mean_loss = group.all_reduce(np.array([loss.item()]))[0] / group.size
    return mean_loss, {name: p.grad for name, p in model.named_parameters()}


def main(args):
    group = parallel.world()
    n = group.size
    idx, targets = global_batch(args.per_rank * n)
    if group.rank == 0:
        print(parallel.launch.launch_report(group))
        print(f"global batch {len(idx)} sequences = {n} ranks x {args.per_rank}")
        rows = [f"  rank {r}: forward+backward on sequences {r * args.per_rank}..{(r + 1) * args.per_rank - 1}"
                f" --> grads_{r} --" for r in range(n)]
        width = max(map(len, rows))
        for row in rows:
            print(row.ljust(width, "-") + "+")
        print(" " * width + "+--> all_reduce(sum) / " + f"{n} --> the same grads on every rank")
    ref_loss, ref = one_device_gradients(idx, targets)
    group.reset_stats()
    dp_loss, grads = data_parallel_gradients(group, idx, targets)
    stats = group.stats()["all_reduce"]
    diff = max(np.abs(grads[k] - ref[k]).max() / max(1.0, np.abs(ref[k]).max()) for k in ref)
    diff = group.all_reduce(np.array([diff]), op="max")[0]
    loss_diff = group.all_reduce(np.array([abs(dp_loss - ref_loss)]), op="max")[0]
    if group.rank == 0:
        print(f"one-device loss {ref_loss:.12f}, mean of the per-rank losses {dp_loss:.12f}")
        print(f"largest loss difference vs one device: {loss_diff:.1e}")
        print(f"largest gradient difference vs one device (over {len(ref)} tensors, every rank; "
              f"relative to max(1, |grad|)): {diff:.1e}")
        n_params = sum(g.size for g in ref.values())
        print(f"all_reduce calls: {stats['calls'] - 1} for the gradients (one per parameter tensor) + 1 for the loss")
        print(f"gradient elements reduced per rank: {stats['elements'] - 1:,} (the model has {n_params:,} parameters)")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--per-rank", type=int, default=2, help="sequences per rank (default 2)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
