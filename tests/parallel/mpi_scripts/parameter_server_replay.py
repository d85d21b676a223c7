"""Under mpiexec -n 3: a stale (s = 1) parameter-server run on real ranks replays bit for bit in one process.

    mpiexec -n 3 python -m mpi4py tests/parallel/mpi_scripts/parameter_server_replay.py
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1]),
               str(Path(__file__).resolve().parents[1] / "data_parallel")]  # tests/, tests/parallel/, its data_parallel/

import numpy as np  # noqa: E402

import parallel  # noqa: E402
import test_parameter_server as cases  # noqa: E402
from parallel.data_parallel.parameter_server import run_parameter_server, scripted_delays, simulate, staleness_schedule  # noqa: E402

SEED, WORKERS, STEPS = 7, 2, 5


def main():
    group = parallel.world()
    assert group.backend == "mpi", group.backend
    tau = staleness_schedule(scripted_delays(SEED, WORKERS, STEPS), 1)
    batch_of = cases.batches(SEED, WORKERS, STEPS)
    out = run_parameter_server(group, *cases.fresh(SEED), batch_of, STEPS, tau)
    if group.rank == 0:
        np.testing.assert_array_equal(out, simulate(*cases.fresh(SEED), batch_of, STEPS, tau))
        print("replayed bit for bit", flush=True)


if __name__ == "__main__":
    main()
