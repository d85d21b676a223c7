"""Chapter 3, part 2: the ring all-reduce of parallel/comm/ring.py, step by step.

    python tutorials/03_collectives/ring_allreduce.py --threads 3
    mpiexec -n 3 python -m mpi4py tutorials/03_collectives/ring_allreduce.py

Rank r contributes 2^r to every element, so a sum of contributions is a set of
ranks written in binary: the script prints, after every step of the ring, which
ranks' contributions each chunk of each rank holds. Then it checks the ring
against the builtin all-reduce and counts the bytes each rank really sent.
"""
import parallel
import numpy as np
from parallel.comm import ring

# --- watching the ring: wrap ring.exchange (the one send+receive of every step) ------------
_exchange = ring.exchange
watched = {}  # rank -> {"flat": the buffer being reduced, "states": [...], "sent": [...], "bytes": int}


def traced_exchange(group, send_buf, dst, recv_buf, src):
    """Before each step, snapshot this rank's buffer; note which chunk it sends and how many bytes."""
    w = watched.get(group.rank)
    if w is not None:
        w["states"].append(w["flat"].copy())
        offset = (send_buf.ctypes.data - w["flat"].ctypes.data) // w["flat"].itemsize
        w["sent"].append(offset // len(send_buf))
        w["bytes"] += send_buf.nbytes
    _exchange(group, send_buf, dst, recv_buf, src)


ring.exchange = traced_exchange


def watch(group, flat):
    watched[group.rank] = {"flat": flat, "states": [], "sent": [], "bytes": 0}
    return watched[group.rank]


def ranks_in(value):
    """The set of ranks whose 2^r contributions add up to `value`, as '{0,2}'."""
    bits = int(value)
    return "{" + ",".join(str(r) for r in range(bits.bit_length()) if bits >> r & 1) + "}"


def show_steps(group):
    """Run the ring on the 2^r buffer and have rank 0 print the chunks after every step;
    returns (states (rank, step, chunk) as 2^r sums, sent (rank, step): the chunk each sent)."""
    n = group.size
    flat = np.full(n, 2.0 ** group.rank)  # n chunks of one element each
    w = watch(group, flat)
    group.all_reduce(flat, algorithm="ring")
    w["states"].append(flat.copy())
    states = group.all_gather(np.array(w["states"])[None])  # (rank, step, chunk)
    sent = group.all_gather(np.array(w["sent"], dtype=np.int64)[None])  # (rank, step)
    if group.rank != 0:
        return states, sent
    width = max(len(ranks_in(2 ** n - 1)) + 2, 9)
    print(f"ring all-reduce on {n} ranks, the buffer cut into {n} chunks; a cell lists the ranks whose\n"
          f"contribution that chunk holds ({ranks_in(2 ** n - 1)} = fully reduced)\n")
    print((" " * 17 + "".join(f"chunk {c}".ljust(width) for c in range(n))).rstrip())
    for step in range(2 * (n - 1) + 1):
        if step == 0:
            title = "start"
        else:
            phase = "reduce-scatter" if step <= n - 1 else "all-gather"
            s = step - 1 if step <= n - 1 else step - n
            moves = ", ".join(f"{r}->{(r + 1) % n}: chunk {sent[r, step - 1]}" for r in range(n))
            title = f"{phase} step {s}   ({moves})"
        print(title)
        for r in range(n):
            print((f"         rank {r}  " + "".join(ranks_in(v).ljust(width) for v in states[r, step])).rstrip())
    return states, sent


def check_and_count(group, elements):
    """The ring's result against the builtin all-reduce, and the bytes each rank sent."""
    n = group.size
    data = np.random.default_rng(group.rank).standard_normal(elements)
    expected = group.all_reduce(data.copy())
    ringed = data.copy()
    w = watch(group, ringed)
    group.reset_stats()
    group.all_reduce(ringed, algorithm="ring")
    counted = group.stats()["all_reduce"]["bytes"]
    error = group.all_reduce(np.array([np.abs(ringed - expected).max()]), op="max")[0]
    sent = group.all_gather(np.array([w["bytes"]]))
    if group.rank == 0:
        formula = 2 * (n - 1) * data.nbytes // n
        print(f"\n{elements:,} float64 elements ({data.nbytes:,} bytes) per rank")
        print(f"largest difference ring vs builtin all-reduce: {error:.1e}")
        for r in range(n):
            print(f"rank {r} sent {sent[r]:,} bytes in the ring")
        print(f"formula 2(n-1)/n x buffer bytes: {formula:,}; group.stats() counted {counted:,}")
        print(f"(sending everything to rank 0 and back would make rank 0 receive and send "
              f"{(n - 1) * data.nbytes:,} bytes each way)")


def main(args):
    group = parallel.world()
    if group.rank == 0:
        print(parallel.launch.launch_report(group))
    steps = show_steps(group)
    check_and_count(group, args.elements)
    return steps  # what tutorials/pictures/ draws


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=120_000, help="buffer size for the check (default 120000)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
