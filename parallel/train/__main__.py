"""Entry point: `python -m parallel.train` (under MPI: `mpiexec -n N python -m mpi4py -m parallel.train`)."""
from .cli import main

main()
