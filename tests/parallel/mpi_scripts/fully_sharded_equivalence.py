"""Under mpiexec: ZeRO-2 and ZeRO-3 equal one device, on real MPI ranks.

    mpiexec -n 4 python -m mpi4py tests/parallel/mpi_scripts/fully_sharded_equivalence.py

Every rank checks its own FullyShardedDataParallel runs against a single-device run it
computes itself (dp_common's checks, as in the threads tests) and prints
"rank r ok: ..."; then `parallel.train --check` trains the 3D layouts below with each
stage (rank 0 compares with one device and prints "layout <dp,tp,pp> zero <s> check <worst>").
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import parallel  # noqa: E402
from dp_common import check_fully_sharded, make_data, run_fully_sharded, run_single  # noqa: E402
from parallel.train import main as train  # noqa: E402

STEPS = 3
CASES = [("tiny", 2, 2, 1), ("tiny", 2, 3, 2), ("gpt", 1, 3, 0), ("gpt", 2, 2, 1)]  # model, micro, stage, prefetch
TINY = ["--steps", "2", "--check", "2", "--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8",
        "--digits", "2", "--log-every", "1"]
LAYOUTS = [((4, 1, 1), "3", []), ((2, 2, 1), "3", ["--sequence-parallel"]),
           ((2, 1, 2), "2", ["--microbatches", "2"]), ((2, 1, 2), "3", ["--microbatches", "2", "--accumulate", "2"])]


def main():
    group = parallel.world()
    assert group.backend == "mpi", group.backend
    for seed, (model, micro, stage, prefetch) in enumerate(CASES):
        data = make_data(seed, group.size, micro, 2, STEPS)
        run = run_fully_sharded(group, model, seed, data, micro, stage, prefetch)
        check_fully_sharded(run, run_single(model, seed, data), group.size, stage, STEPS)
    print(f"rank {group.rank} ok: {len(CASES)} FullyShardedDataParallel runs", flush=True)
    for (dp, tp, pp), stage, extra in LAYOUTS:
        result = train(TINY + extra + ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero", stage])
        if group.rank == 0:
            assert result["check"] is not None and result["check"] <= 1e-9, result
            print(f"layout {dp},{tp},{pp} zero {stage} check {result['check']:.1e}", flush=True)


if __name__ == "__main__":
    main()
