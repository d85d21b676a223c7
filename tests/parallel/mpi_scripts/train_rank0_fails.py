"""`python -m parallel.train`'s entry point with rank 0's evaluation failing (FileExistsError on PATH)
while the other ranks wait for it: the job must print one line and end every rank.

    mpiexec -n 2 python train_rank0_fails.py PATH [parallel.train flags...]
"""
import sys

import parallel
import parallel.train.loop as loop
from parallel.train import main
from parallel.train.errors import run_job

path, argv = sys.argv[1], sys.argv[2:]


def evaluate_fails(model, task):
    raise FileExistsError(17, "File exists", path)


if parallel.world().rank == 0:
    loop.evaluate = evaluate_fails
run_job(main, argv)
