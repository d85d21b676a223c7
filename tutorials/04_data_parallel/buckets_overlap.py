"""Chapter 4, part 2: DataParallel's buckets, filling up during backward and sent while it runs.

    python tutorials/04_data_parallel/buckets_overlap.py --threads 2 [--bucket-kib 48]
    mpiexec -n 2 python -m mpi4py tutorials/04_data_parallel/buckets_overlap.py

Wraps the chapter's GPT in parallel.DataParallel with small buckets, prints
which parameters share a bucket, then replays one backward: a line per
gradient as it becomes final, with every bucket's state (how many of its
gradients are ready, or SENT once its all-reduce has started). Then checks the
gradients against one device, with and without overlap.
"""
import parallel
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT
from average_gradients import CONFIG, global_batch, one_device_gradients


def describe_buckets(dp):
    names = dp.names
    print(f"{len(dp.buckets)} buckets, filled in reverse registration order (roughly the order backward "
          f"produces gradients):")
    for i, bucket in enumerate(dp.buckets):
        first, last = names[id(bucket.params[0])], names[id(bucket.params[-1])]
        print(f"  bucket {i}: {len(bucket.params):2d} tensors, {bucket.nbytes:7,} bytes   {first} ... {last}")


def watch_backward(dp):
    """Add a hook after DataParallel's own on every parameter: it records the buckets' state."""
    rows = []

    def record(p):
        if dp.waiting_for == len(dp.bucket_of):  # DataParallel just finished the sync and reset
            cells = ["done"] * len(dp.buckets)
        else:
            cells = ["SENT" if i < dp.reducer.started else f"{len(ready)}/{len(b.params)}"
                     for i, (b, ready) in enumerate(zip(dp.buckets, dp.ready))]
        rows.append((dp.names[id(p)], dp.bucket_of[id(p)], cells))

    for p in dp.parameters():
        p.register_post_accumulate_grad_hook(record)
    return rows


def print_timeline(dp, rows):
    name_width = max(len(name) for name, _, _ in rows)
    name_width = max(name_width, len("gradient ready (backward order)"))
    print(f"\n{'gradient ready (backward order)':<{name_width}}  bucket  " +
          "".join(f"b{i:<5}" for i in range(len(dp.buckets))).rstrip())
    for name, bucket, cells in rows:
        print(f"{name:<{name_width}}  {bucket:>6}  " + "".join(f"{c:<6}" for c in cells).rstrip())
    started_early = sum(cell == "SENT" for cell in rows[-2][2])
    print(f"buckets whose all-reduce started before the last gradient was ready: "
          f"{started_early} of {len(dp.buckets)}")
    print("(the last gradient's hook sends the last bucket, waits for every bucket and writes the averages back)")


def data_parallel_gradients(group, idx, targets, bucket_kib, overlap, show):
    mt.manual_seed(0)
    dp = parallel.DataParallel(GPT(CONFIG).double(), group, bucket_mb=bucket_kib / 1024, overlap=overlap)
    rows = watch_backward(dp)
    mine = slice(group.rank * len(idx) // group.size, (group.rank + 1) * len(idx) // group.size)
    group.reset_stats()
    _, loss = dp(idx[mine], targets[mine])
    loss.backward()  # returns with the gradients already averaged
    if show:
        describe_buckets(dp)
        print_timeline(dp, rows)
    return {name: p.grad for name, p in dp.named_parameters()}, rows, group.stats()["all_reduce"]


def largest_difference(group, grads, ref):
    diff = max(np.abs(grads[k] - ref[k]).max() / max(1.0, np.abs(ref[k]).max()) for k in ref)
    return group.all_reduce(np.array([diff]), op="max")[0]


def main(args):
    group = parallel.world()
    idx, targets = global_batch(2 * group.size)
    if group.rank == 0:
        print(parallel.launch.launch_report(group))
    _, ref = one_device_gradients(idx, targets)
    overlapped, rows, stats = data_parallel_gradients(group, idx, targets, args.bucket_kib, True,
                                                           show=group.rank == 0)
    after, _, _ = data_parallel_gradients(group, idx, targets, args.bucket_kib, False, show=False)
    diff, off_diff = largest_difference(group, overlapped, ref), largest_difference(group, after, ref)
    if group.rank == 0:
        print(f"\nall_reduce calls in this backward: {stats['calls']} (one per bucket, {len(rows[0][2])} buckets)")
        print(f"largest gradient difference vs one device, overlapped: {diff:.1e}")
        print(f"largest gradient difference vs one device, all-reduce after backward: {off_diff:.1e}")
    return rows  # (gradient name, its bucket, every bucket's state): what tutorials/pictures/ draws


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--bucket-kib", type=float, default=48, help="bucket size in KiB (default 48)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
