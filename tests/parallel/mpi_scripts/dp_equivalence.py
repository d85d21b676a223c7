"""Under mpiexec: DataParallel and ZeRO-1 equal one device, on real MPI ranks.

    mpiexec -n N python -m mpi4py tests/parallel/mpi_scripts/dp_equivalence.py

Every rank checks its own results against a single-device run it computes itself
(the checks are dp_common's, as in the threads tests) and prints "rank r ok: ...".
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import parallel  # noqa: E402
from dp_common import check_data_parallel, check_zero, make_data, run_data_parallel, run_single, run_zero  # noqa: E402

STEPS = 3
# (model, micro-batches, bucket MiB, overlap, explicit finish): tiny buckets, overlap on and off, no_sync.
DP_CASES = [("tiny", 2, 1e-6, True, False), ("tiny", 3, 0.001, False, True), ("gpt", 2, 0.002, True, False)]
ZERO_CASES = [("tiny", 2), ("gpt", 1)]


def main():
    group = parallel.world()
    assert group.backend == "mpi", group.backend
    n = group.size
    for seed, (model, micro, bucket_mb, overlap, explicit_finish) in enumerate(DP_CASES):
        data = make_data(seed, n, micro, 2, STEPS)
        run = run_data_parallel(group, model, seed, data, micro, bucket_mb, overlap, explicit_finish)
        check_data_parallel(run, run_single(model, seed, data), n, STEPS)
    for seed, (model, micro) in enumerate(ZERO_CASES):
        data = make_data(seed, n, micro, 2, STEPS)
        check_zero(run_zero(group, model, seed, data, micro), run_single(model, seed, data), n, STEPS)
    print(f"rank {group.rank} ok: {len(DP_CASES)} DataParallel and {len(ZERO_CASES)} ZeRO-1 runs", flush=True)


if __name__ == "__main__":
    main()
