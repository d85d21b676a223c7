"""Under mpiexec: the last rank stops itself (SIGSTOP) while the others wait for it, with a 3 s deadline.

argv[1]: what the others wait in: "all_reduce" (every other rank), or "recv" (rank 0 receives from it).
The stopped rank prints its pid first, so that the test can check it is gone afterwards.
"""
import os
import signal
import sys

import numpy as np

import parallel

group = parallel.world(timeout=3)
stuck = group.size - 1
if group.rank == stuck:
    print(f"rank {stuck} stops itself: pid {os.getpid()}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
if sys.argv[1] == "all_reduce":
    group.all_reduce(np.ones(4))
elif group.rank == 0:
    group.recv(np.ones(4), src=stuck, tag=5)
