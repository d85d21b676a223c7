"""mpiexec worker: a tensor-parallel GPT against one device on real MPI ranks.

    mpiexec -n 2 python -m mpi4py tests/parallel/mpi_scripts/tp_equivalence.py
    mpiexec -n 4 ...   (also tp=2 inside a dp=2 x tp=2 mesh: two tp groups at once)

Every rank runs the dense reference itself and the same checks as the threads tests
(tp_common.py); each prints "rank r ok [<layouts>]" at the end.
"""
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(TESTS), str(TESTS / "parallel" / "tensor_parallel")]

import parallel  # noqa: E402
from tp_common import (  # noqa: E402
    check_against_dense, check_replicas_identical, make_batches, run_dense, run_tensor_parallel,
)

CONFIG = dict(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=8)  # 11: padded for every tp > 1
BATCH, SEQ, STEPS, SEED = 2, 4, 3, 7


def gather_replicated(replicated, group):
    """Every tp rank's replicated parameters, gathered to check that they are identical."""
    return [{name: group.all_gather(value[None], axis=0)[r] for name, value in replicated.items()}
            for r in range(group.size)]


def check_layout(group, sequence_parallel):
    batches = make_batches(CONFIG, BATCH, SEQ, STEPS, SEED)
    run = run_tensor_parallel(CONFIG, SEED, batches, group, sequence_parallel)
    check_against_dense(run, run_dense(CONFIG, SEED, batches))
    check_replicas_identical(gather_replicated(run[2], group))
    return f"tp={group.size} sp={sequence_parallel}"


def main():
    world = parallel.world()
    assert world.backend == "mpi", world.backend
    done = [check_layout(world, sp) for sp in (False, True)]
    if world.size == 4:
        mesh = parallel.Mesh(dp=2, tp=2)
        done.append("mesh dp=2 " + check_layout(mesh.tp_group, sequence_parallel=True))
    print(f"rank {world.rank} ok [{', '.join(done)}]", flush=True)


if __name__ == "__main__":
    main()
