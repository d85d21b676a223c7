"""The chapters' pictures, drawn from the numbers their scripts print.

    pip install -e '.[plots]'                      # matplotlib, the one optional dependency
    python -m tutorials.pictures                   # every picture, into tutorials/NN_*/pictures/
    python -m tutorials.pictures ring_steps mesh_grid --out /tmp/pictures
    python -m tutorials.pictures --chapter 14 16   # the pictures of chapters 14 and 16
    python -m tutorials.pictures --text            # the text form of every picture instead
    python -m tutorials.pictures --list

One source: each picture calls the chapter script's own functions — its `main` on
thread ranks, its `simulate`, or the functions its `main` is made of — or the library
function the script calls, with the script's settings, and takes the numbers the script
prints; matplotlib draws those numbers. Without matplotlib (or with --text) the command
prints the text the chapter prints for the same run instead (or, where the script only
prints, those numbers as text), so no chapter needs matplotlib. `--quick` shrinks the
slow runs (training, sweeps) for the test suite; the committed pictures are made without it.
Timing-dependent pictures use simulated timelines, modelled link times or medians.

The package: `draw.py` (running a script, the shared drawings), one module per group of
chapters (`foundations`, `layouts`, `pipelines`, `communication`, `staleness`, `search`, `experts`), `cli.py`.

Why a part of `tutorials/` and not of `parallel/`: a picture is teaching material
about one chapter's run, the library stays free of a plotting dependency, and what
the library does draw — `Timeline.render`, `Mesh.describe` — is the text the
scripts print and this package's fallback.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the thread ranks share the cores (before numpy loads)

import parallel  # noqa: E402,F401  (first of the project's imports: one BLAS thread per rank)

from .cli import PICTURES, main  # noqa: E402
from .draw import TUTORIALS, Picture  # noqa: E402

__all__ = ["PICTURES", "TUTORIALS", "Picture", "main"]
