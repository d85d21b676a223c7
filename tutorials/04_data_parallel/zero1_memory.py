"""Chapter 4, part 3: ZeRO-1 — each rank keeps the AdamW moments of only its 1/n of the parameters.

    python tutorials/04_data_parallel/zero1_memory.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/04_data_parallel/zero1_memory.py

Trains the chapter's float64 GPT for a few steps three ways on the same global
batches: one device with AdamW, DataParallel with AdamW, and ZeroOptimizer.
Prints the optimizer memory on every rank as bars, the bytes each rank
communicated per step, and the largest parameter difference from one device.
"""
import parallel
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT
from minitensor.optim import AdamW
from average_gradients import CONFIG, global_batch

LR = 1e-2


def batches(steps, size):
    return [global_batch(size, seed=step) for step in range(steps)]


def train(model, optimizer, data, rank=None, size=1):
    """Run the steps on this rank's slice (the whole batch when rank is None); return the parameters."""
    for idx, targets in data:
        mine = slice(None) if rank is None else slice(rank * len(idx) // size, (rank + 1) * len(idx) // size)
        optimizer.zero_grad()
        _, loss = model(idx[mine], targets[mine])
        loss.backward()
        optimizer.step()
    return {name: p.data.copy() for name, p in model.named_parameters()}


def fresh_model():
    mt.manual_seed(0)
    return GPT(CONFIG).double()


def bar(nbytes, largest, width=40):
    return "#" * max(1, round(width * nbytes / largest))


def main(args):
    group = parallel.world()
    n, rank = group.size, group.rank
    data = batches(args.steps, 2 * n)

    one = fresh_model()
    ref = train(one, AdamW(one.parameters(), lr=LR), data)

    dp_model = parallel.DataParallel(fresh_model(), group)
    dp_adamw = AdamW(dp_model.parameters(), lr=LR)
    group.reset_stats()
    dp_params = train(dp_model, dp_adamw, data, rank, n)
    dp_stats = group.stats()

    zero_model = fresh_model()
    zero = parallel.ZeroOptimizer(zero_model.parameters(), group, lr=LR)
    group.reset_stats()
    zero_params = train(zero_model, zero, data, rank, n)
    zero_stats = group.stats()

    def worst(params):
        diff = max(np.abs(params[k] - ref[k]).max() / max(1.0, np.abs(ref[k]).max()) for k in ref)
        return group.all_reduce(np.array([diff]), op="max")[0]

    dp_diff, zero_diff = worst(dp_params), worst(zero_params)
    memory = group.all_gather(np.array([[dp_adamw.state_bytes(), zero.state_bytes()]]))  # (rank, 2)
    shards = group.all_gather(np.array([zero.shard]))
    if rank != 0:
        return
    print(parallel.launch.launch_report(group))
    n_params = sum(p.size for p in one.parameters())
    param_bytes = sum(p.data.nbytes for p in one.parameters())
    print(f"{n_params:,} float64 parameters ({param_bytes:,} bytes); AdamW keeps two moments per parameter\n")
    print("optimizer state per rank (the AdamW moments):")
    largest = memory.max()
    for label, column in (("DataParallel + AdamW", 0), ("ZeroOptimizer (ZeRO-1)", 1)):
        print(f"  {label}")
        for r in range(n):
            print(f"    rank {r} {bar(memory[r, column], largest):<40} {memory[r, column]:>9,} bytes")
    for r in range(n):
        start, stop = shards[r]
        print(f"  ZeRO-1 rank {r} owns flat parameters [{start:,}, {stop:,})")
    print(f"optimizer state per rank, AdamW: {memory[:, 0].max():,} bytes")
    print(f"optimizer state per rank, ZeRO-1: {memory[:, 1].max():,} bytes")
    print(f"ZeRO-1 saving: {memory[:, 0].max() / memory[:, 1].max():.2f}x on {n} ranks "
          f"(parameters and gradients stay whole on every rank)\n")

    def per_step(stats, kinds):
        return sum(stats[k]["bytes"] for k in kinds if k in stats) // args.steps

    print(f"bytes sent per rank per step, DataParallel (all_reduce): {per_step(dp_stats, ['all_reduce']):,}")
    print(f"bytes sent per rank per step, ZeRO-1 (reduce_scatter + all_gather): "
          f"{per_step(zero_stats, ['reduce_scatter', 'all_gather']):,}")
    print(f"largest parameter difference after {args.steps} steps vs one device, DataParallel: {dp_diff:.1e}")
    print(f"largest parameter difference after {args.steps} steps vs one device, ZeRO-1: {zero_diff:.1e}")
    return memory  # (rank, [AdamW, ZeRO-1]) optimizer-state bytes: what tutorials/pictures/ draws


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
