"""Chapter 9, part 4: the main job, `python -m parallel.train --check`, on this chapter's tiny model.

    python tutorials/09_3d/main_job_check.py --threads 8
    mpiexec -n 8 python -m mpi4py tutorials/09_3d/main_job_check.py [--dp 1 --tp 2 --pp 4]

Runs `parallel.train.main` — exactly what `python -m parallel.train` runs — with --check
on a 2-digit addition task and a GPT small enough for a laptop, and prints the command
line it stands for first. The main job then prints its start-up summary (the mesh
picture), one `check step` line per step (relative loss and largest relative gradient
difference to the single-device GPT on rank 0, and the gradient's name), the final
check line, and the communication per step counted by the groups.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import parallel  # first: it sets one BLAS thread per rank under mpiexec
from parallel.launch import launched_by_mpiexec, rank_arguments
from parallel.train import main as train_main

TINY = ["--n-layer", "4", "--n-head", "4", "--d-model", "32", "--digits", "2", "--batch", "16", "--steps", "3",
        "--microbatches", "2", "--check", "3"]


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=8)
    parser.add_argument("--dp", default="2")
    parser.add_argument("--tp", default="2")
    parser.add_argument("--pp", default="2")
    args = parser.parse_args()
    argv = ["--dp", args.dp, "--tp", args.tp, "--pp", args.pp] + TINY
    if not launched_by_mpiexec():
        argv += ["--threads", str(args.threads)]
    if parallel.world().rank == 0:
        print("python -m parallel.train " + " ".join(argv), flush=True)
    train_main(argv)
