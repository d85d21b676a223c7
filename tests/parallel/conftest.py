"""The tests of parallel/ share the worker scripts and helpers in mpi_scripts/; the tests in
the sub-folders (one per package: data_parallel/, hybrid/, pipeline/, ...) import them as
`mpi_scripts.<name>`, so this folder goes on sys.path once, here."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
