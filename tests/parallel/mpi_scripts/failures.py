"""Under mpiexec: one way to fail, chosen by argv[1]; the test checks the job ends with the right error.

raise      the last rank raises while the others wait in recv / all_reduce
bad_recv   rank 1 receives into a buffer of the wrong shape and dtype
bad_mesh   a Mesh that does not fit the world: every rank reports the error, then the job exits cleanly
"""
import sys
import time

import numpy as np

import parallel

group = parallel.world()
mode = sys.argv[1]
if mode == "raise":
    if group.rank == group.size - 1:
        time.sleep(0.2)
        raise ValueError(f"rank {group.rank} failed on purpose")
    if group.rank == 0:
        group.recv(np.zeros(2), src=group.size - 1)
    group.all_reduce(np.zeros(2))
elif mode == "bad_recv":
    if group.rank == 0:
        group.send(np.zeros(3), dst=1, tag=7)
    elif group.rank == 1:
        group.recv(np.zeros(4, np.float32), src=0, tag=7)
elif mode == "bad_mesh":
    try:
        parallel.Mesh(dp=group.size, tp=2)
    except ValueError as exc:
        sys.stdout.write(f"rank {group.rank}: {exc}\n")  # one write: lines of ranks do not interleave
        sys.stdout.flush()
