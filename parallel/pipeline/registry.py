"""Every pipeline schedule by name: the one place that knows them all.

schedules.py builds GPipe, 1F1B and interleaved 1F1B; zero_bubble.py builds ZB-H1 and ZB-H2
and dualpipe.py DualPipe and DualPipeV on its helpers. This registry imports them all, so none imports another.
"""
from .dualpipe import dualpipe, dualpipev
from .schedules import gpipe, interleaved, one_f_one_b
from .zero_bubble import zb_h1, zb_h2

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipev", "dualpipe")
# Two chunks per rank, and where they sit (placement.py); every other schedule places chunks "loop".
TWO_CHUNKS = {"dualpipev": (dualpipev, "v", "stages r and 2p-1-r"),
              "dualpipe": (dualpipe, "mirror", "stage r and the mirrored copy of stage p-1-r")}
ONE_CHUNK = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1, "zb-h2": zb_h2}


def placement_of(name):
    """Which stage each (rank, chunk) holds under schedule `name` (placement.PLACEMENTS)."""
    return TWO_CHUNKS[name][1] if name in TWO_CHUNKS else "loop"


def get_schedule(name, p, m, v=1):
    """The schedule called `name` (one of SCHEDULES)."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose one of {SCHEDULES}")
    if name == "interleaved":
        return interleaved(p, m, v)
    if name in TWO_CHUNKS:
        build, _, held = TWO_CHUNKS[name]
        if v != 2:
            raise ValueError(f"schedule {name!r} runs two model chunks per rank ({held}), got v={v}")
        return build(p, m)
    if v != 1:
        raise ValueError(f"schedule {name!r} runs one model chunk per rank, got v={v}; "
                         f"use 'interleaved' for v > 1")
    return ONE_CHUNK[name](p, m)
