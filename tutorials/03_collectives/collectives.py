"""Chapter 3, part 1: the five operations every parallel layout is built from, before and after.

    python tutorials/03_collectives/collectives.py --threads 2          # 2 ranks as threads
    mpiexec -n 2 python -m mpi4py tutorials/03_collectives/collectives.py

Rank r starts with [10r, 10r+1, ...] (2 elements per rank). For each operation the script prints
every rank's buffer before and after, and checks the result on every rank
against the same operation done with plain numpy on all ranks' inputs.
"""
import parallel
import numpy as np


def rank_data(rank, size):
    """What rank `rank` of `size` starts with: [10r, 10r+1, ...], 2 elements per rank so that
    reduce_scatter has a chunk of 2 for each. Every rank can compute every other's."""
    return 10.0 * rank + np.arange(2 * size)


def show(group, label, arr):
    """Rank 0 prints every rank's `arr`, a line per rank (gathered with all_gather, itself a collective)."""
    rows = group.all_gather(arr[None])
    if group.rank == 0:
        for r, row in enumerate(rows):
            print(f"  {label if r == 0 else '':<7} rank {r}: {row.astype(int)}")


def largest_error(group, got, expected):
    """The largest |got − expected| over every rank."""
    error = np.array([np.abs(got - expected).max()])
    return group.all_reduce(error, op="max")[0]


def demo(group, name, picture, run, expected):
    """Print the operation's picture, its before/after rows and its worst error over the ranks."""
    if group.rank == 0:
        print(f"\n{name}: {picture}")
    before = rank_data(group.rank, group.size)
    show(group, "before", before)
    after = run(before.copy())
    show(group, "after", after)
    error = largest_error(group, after, expected)
    if group.rank == 0:
        print(f"  {name} matches numpy on every rank: largest difference {error:g}")


def main(args):
    group = parallel.world()
    n, rank = group.size, group.rank
    if rank == 0:
        print(parallel.launch.launch_report(group))
    everyone = np.stack([rank_data(r, n) for r in range(n)])  # what numpy would see on one device

    right, left = (rank + 1) % n, (rank - 1) % n

    def shift_right(buf):
        received = np.empty_like(buf)
        sending = group.isend(buf, right)  # non-blocking, so every rank can send before receiving
        group.recv(received, left)
        sending.wait()
        return received

    demo(group, "send/recv", "each rank sends its buffer to rank + 1 (a ring shift)",
         shift_right, everyone[left])
    demo(group, "broadcast", "rank 0's buffer is copied to every rank",
         lambda buf: group.broadcast(buf, root=0), everyone[0])
    demo(group, "all_gather", "every rank gets all buffers, concatenated in rank order",
         lambda buf: group.all_gather(buf), everyone.reshape(-1))
    demo(group, "reduce_scatter", "sum over ranks, then rank r keeps chunk r (2 elements)",
         lambda buf: group.reduce_scatter(buf), everyone.sum(axis=0)[2 * rank:2 * rank + 2])
    demo(group, "all_reduce", "every rank gets the elementwise sum",
         lambda buf: group.all_reduce(buf), everyone.sum(axis=0))


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
