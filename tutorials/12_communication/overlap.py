"""Chapter 12, part 2: a bucket sent during backward hides its time behind compute.

    python tutorials/12_communication/overlap.py --threads 2 [--link 1gbe] [--bucket-kib 256]
    mpiexec -n 2 python -m mpi4py tutorials/12_communication/overlap.py

DataParallel on the default GPT over a simulated link (LinkGroup), with small buckets,
one step with overlap (each bucket's all-reduce starts from the gradient hooks, while
backward computes the rest) and one without (every bucket starts after backward). For
each: the buckets that started before the last gradient was ready, the modelled and the
EXPOSED communication time (how long the rank sat blocked in a wait: the part compute
did not hide), and the step time. A non-blocking operation's modelled time runs from its
start, so compute done meanwhile really hides it. The gradients are the same either way.
"""
import time

import numpy as np

import parallel
from parallel.comm.link import LinkGroup, parse_link
from slow_link import default_model


def one_step(group, overlap, bucket_kib):
    model, task, batch = default_model()
    last_ready = [0.0]
    for p in model.parameters():  # registered before DataParallel's own hooks: runs first
        p.register_post_accumulate_grad_hook(lambda p: last_ready.__setitem__(0, time.perf_counter()))
    dp = parallel.DataParallel(model, group, bucket_mb=bucket_kib / 1024, overlap=overlap)
    rows = batch // group.size
    idx, targets = task.get_batch(batch, generator=np.random.default_rng(1))
    mine = slice(group.rank * rows, (group.rank + 1) * rows)
    group.barrier()
    group.reset_stats()
    start = time.perf_counter()
    dp(idx[mine], targets[mine])[1].backward()  # returns with the gradients averaged
    step = time.perf_counter() - start
    early = sum(start < last_ready[0] for _, start, _ in dp.reducer.spans)
    seconds = group.stats()["all_reduce"]
    grads = np.concatenate([p.grad.reshape(-1) for p in model.parameters()])
    return early, len(dp.buckets), seconds["modelled_s"], seconds["exposed_s"], step, grads


def main(args):
    group = LinkGroup(parallel.world(), parse_link(args.link))
    on = one_step(group, True, args.bucket_kib)
    off = one_step(group, False, args.bucket_kib)
    same = group.all_reduce(np.array([int(np.array_equal(on[-1], off[-1]))]), op="min")[0]
    if group.rank == 0:
        print(f"DataParallel on {group.size} ranks over a simulated {args.link} link, {on[1]} buckets of "
              f"≤ {args.bucket_kib:g} KiB (rank 0's figures)")
        for name, (early, buckets, modelled, exposed, step, _) in (("overlap on ", on), ("overlap off", off)):
            print(f"  {name}: buckets started before the last gradient was ready: {early} of {buckets}; "
                  f"modelled comm {modelled:.4f} s, exposed comm {exposed:.4f} s, step {step:.4f} s")
        print(f"hidden by overlap (exposed off − exposed on): {off[3] - on[3]:.4f} s")
        print(f"gradients bit for bit equal with and without overlap: {bool(same)}")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--link", default="1gbe", help="link profile or ALPHA,BETA (default 1gbe)")
    parser.add_argument("--bucket-kib", type=float, default=256, help="bucket size in KiB (default 256)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
