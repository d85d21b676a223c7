"""Chapter 12, part 1: what one gradient all-reduce costs on each kind of link.

    python tutorials/12_communication/slow_link.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/12_communication/slow_link.py

The default model of `python -m parallel.train` (the addition task's GPT, float32) has P
parameters; data parallelism all-reduces 4·P bytes every step. For each link profile of
parallel.comm.link the α–β time of that ring all-reduce, 2(n−1)(α + 4P/n·β), beside the
time of one forward + backward of the rank's share of the batch, measured here. Then
the same all-reduce on a simulated 1 GbE link (LinkGroup): it takes at least its
modelled time, and its result is bit for bit the plain group's.
"""
import time

import parallel  # first: it sets one BLAS thread per rank under mpiexec (the timings compare)
import numpy as np
import minitensor as mt
from minitensor.data import AdditionTask, recommended_config
from minitensor.models.gpt import GPT, GPTConfig
from parallel.comm.link import LINKS, LinkGroup, parse_link


def default_model():
    rec = recommended_config()
    task = AdditionTask(rec["digits"])
    config = GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=rec["n_layer"],
                       n_head=rec["n_head"], d_model=rec["d_model"])
    mt.manual_seed(0)
    return GPT(config), task, rec["batch_size"]


def compute_seconds(model, task, rows):
    """Median of 3 forward + backward passes over `rows` sequences."""
    idx, targets = task.get_batch(rows, generator=np.random.default_rng(0))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model(idx, targets)[1].backward()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(args):
    group = parallel.world()
    n = group.size
    model, task, batch = default_model()
    params = sum(p.size for p in model.parameters())
    nbytes = 4 * params
    compute = group.all_reduce(np.array([compute_seconds(model, task, batch // n)]), op="max")[0]
    gradient = np.random.default_rng(group.rank).standard_normal(params).astype(np.float32)
    plain = group.all_reduce(gradient.copy())
    gbe = LinkGroup(group, parse_link("1gbe"))
    start = time.monotonic()
    linked = gbe.all_reduce(gradient.copy())
    measured = time.monotonic() - start
    modelled = gbe.stats()["all_reduce"]["modelled_s"]
    same = group.all_reduce(np.array([int(np.array_equal(plain, linked))]), op="min")[0]
    if group.rank == 0:
        print(f"default model: {params:,} parameters; gradient bytes: {nbytes:,} (float32)")
        print(f"forward + backward of {batch // n} sequences per rank (measured, slowest rank): {compute:.4f} s")
        print(f"ring all-reduce of the gradient on {n} ranks, 2(n−1)(α + N/n·β):")
        for name, figures in LINKS.items():
            seconds = parse_link(name).seconds("all_reduce", n, nbytes)
            print(f"  {name:<9} α {figures['alpha_us']:>5g} µs  {figures['bandwidth_gbps']:>6g} GB/s  "
                  f"modelled all-reduce {seconds:.6f} s = {seconds / compute:.3g} × the compute")
        print(f"1gbe all-reduce on a LinkGroup: modelled {modelled:.6f} s, measured {measured:.6f} s, "
              f"at least the modelled time: {measured >= modelled}")
        print(f"result bit for bit the plain group's on every rank: {bool(same)}")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parallel.comm.run_on_ranks(parser.parse_args().threads, main, parser.parse_args())
