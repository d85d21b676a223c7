"""Under mpiexec (with PARALLEL_DEBUG=1): collective calls that do not match across ranks; argv[1] chooses.

kind    rank 0 all-reduces 4 numbers while rank 1 broadcasts 4
shape   rank 0 all-gathers 2 numbers, rank 1 three
"""
import sys

import numpy as np

import parallel

group = parallel.world()
if sys.argv[1] == "kind":
    if group.rank == 0:
        group.all_reduce(np.zeros(4))
    else:
        group.broadcast(np.zeros(4))
else:
    group.all_gather(np.zeros(2 + group.rank))
