"""Under mpiexec: compressed data parallelism equals its exact references on real MPI ranks.

    mpiexec -n N python -m mpi4py tests/parallel/mpi_scripts/compress_equivalence.py

Each rank checks its own run against a reference it computes itself (the checks are
compress_common's, as in the threads tests), on a simulated 10 GbE link (which must
change nothing), and prints "rank r ok: ...".
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]  # tests/, tests/parallel/

import parallel  # noqa: E402
from parallel.comm.link import with_link  # noqa: E402
from mpi_scripts.compress_common import check_bytes, check_same_training, make_hook, reference, run_compressed  # noqa: E402
from mpi_scripts.dp_common import make_data  # noqa: E402

STEPS = 3
CASES = [("powersgd", dict(rank=100, min_compression_rate=0), 25), ("powersgd", dict(rank=2), 1e-6),
         ("powersgd", dict(rank=1), 25), ("topk", dict(ratio=1.0), 0.001)]
BYTES = [("topk", dict(ratio=0.2)), ("sign", {})]


def main():
    group = with_link(parallel.world(), "10gbe")
    assert group.inner.backend == "mpi", group.inner.backend
    n = group.size
    for seed, (name, options, bucket_mb) in enumerate(CASES):
        data = make_data(seed, n, 1, 2, STEPS)
        run = run_compressed(group, make_hook(name, **options), seed, data, bucket_mb)
        check_same_training(run, reference(name, options, seed, data, bucket_mb))
        if name == "powersgd":
            check_bytes(run, make_hook(name, **options), n)
    for seed, (name, options) in enumerate(BYTES):
        check_bytes(run_compressed(group, make_hook(name, **options), seed, make_data(seed, n, 1, 2, STEPS), 0.001),
                    make_hook(name, **options), n)
    print(f"rank {group.rank} ok: {len(CASES)} references, {len(BYTES) + 3} byte counts", flush=True)


if __name__ == "__main__":
    main()
