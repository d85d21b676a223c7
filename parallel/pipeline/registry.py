"""Every pipeline schedule by name: the one place that knows them all.

schedules.py builds GPipe, 1F1B and interleaved 1F1B; zero_bubble.py builds ZB-H1 and ZB-H2
on its helpers. This registry imports both, so neither imports the other.
"""
from .schedules import gpipe, interleaved, one_f_one_b
from .zero_bubble import zb_h1, zb_h2

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")


def get_schedule(name, p, m, v=1):
    """The schedule called `name` (one of SCHEDULES)."""
    if name == "interleaved":
        return interleaved(p, m, v)
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose one of {SCHEDULES}")
    if v != 1:
        raise ValueError(f"schedule {name!r} runs one model chunk per rank, got v={v}; "
                         f"use 'interleaved' for v > 1")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1, "zb-h2": zb_h2}[name](p, m)
