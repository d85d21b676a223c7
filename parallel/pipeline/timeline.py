"""Timelines of a pipeline step: a text picture, a Chrome trace, the bubble.

An `Event` is one action of one rank with its start and end time. The
checker's static simulation produces events in abstract time units
(forward 1, backward 2); the executor records the same records with real
seconds. A `Timeline` draws either kind.

Bubble theory (p ranks, m micro-batches, v chunks per rank, forward and
backward of a whole stage costing t_f and t_b, communication free):
  GPipe and 1F1B both idle p-1 slots of (t_f + t_b) on every rank, while the
  useful work is m (t_f + t_b). Megatron-LM states the bubble relative to the
  ideal compute time:  ratio = (p-1)/m. Interleaving v chunks makes each
  slot v times shorter:  ratio = (p-1)/(v m)  (Megatron-LM, 2021, sec. 2.2).
  A measurement sees the bubble as a fraction of the total time,
      fraction = idle / (idle + compute) = ratio / (1 + ratio)
               = (p-1) / (v m + p - 1),
  which for v = 1 is the familiar (p-1)/(m+p-1).
With the backward split (zero_bubble.py) and F, B, W each costing t, 1F1B is the
case t_f = t, t_b = 2t; ZB-H1 and ZB-H2 idle only (p-1)·t per rank once m >= p:
  fraction = 1 - 3m / (2m + p - 1 + max(m, p))   (= (p-1)/(3m+p-1) for m >= p).
DualPipe and DualPipeV at the same costs idle DeepSeek-V3's (PP/2-1)(F&B+B-3W) = PP-2 units per
rank (F&B = F + B = 3 on a CPU; PP = p ranks for DualPipe, 2p stages for the V on p ranks), beside
3m (DualPipe: m/2 each way on two chunks) or 6m (the V) of work, once m reaches the steady state
(m >= 3p - 4 for DualPipe, 3p - 2 for the V; with fewer the short schedule idles less):
  fraction = (p-2)/(3m+p-2) (DualPipe),   (p-1)/(3m+p-1) (DualPipeV).
"""
import json
from dataclasses import asdict, dataclass

import numpy as np

from ..comm.gather import all_gather_ragged
from .schedules import COMPUTE_KINDS, KINDS

# Events of a step: the schedule's actions, and the gradient buckets' communication over the
# replicas (from the bucket's start until the reducer has its result; parallel.data_parallel.reducer's
# spans): dp × cp, and a mixture of experts' edp (parallel.hybrid.sections).
EVENT_KINDS = KINDS + ("dp_bucket", "edp_bucket")


@dataclass(frozen=True)
class Event:
    """Action `kind` of (microbatch, chunk) ran on `rank` from `start` to `end`."""
    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


def all_gather_events(group, events, rank=None):
    """Every rank's events, on every rank (a collective); each labelled with `rank` when given
    (e.g. the world rank), else with its own `Event.rank`. Six numbers travel per event."""
    rows = np.array([[e.rank if rank is None else rank, EVENT_KINDS.index(e.kind), e.microbatch, e.chunk, e.start, e.end]
                     for e in events], dtype=np.float64).reshape(-1)
    return [Event(int(r), EVENT_KINDS[int(k)], int(mb), int(c), start, end)
            for flat in all_gather_ragged(group, rows) for r, k, mb, c, start, end in flat.reshape(-1, 6)]


def megatron_bubble_ratio(p, m, v=1):
    """Bubble time relative to the ideal compute time: (p-1)/(v m)."""
    return (p - 1) / (v * m)


def bubble_theory(p, m, v=1, schedule="1f1b"):
    """Bubble as a fraction of the total time: (p-1)/(v m + p - 1); for the
    zero-bubble schedules (F = B = W) 1 - 3m / (2m + p - 1 + max(m, p)), and for DualPipe(V) table 2's."""
    if schedule in ("zb-h1", "zb-h2"):
        return 1 - 3 * m / (2 * m + p - 1 + max(m, p))
    if schedule in ("dualpipe", "dualpipev"):
        idle = p - 2 if schedule == "dualpipe" else p - 1
        return idle / (3 * m + idle)
    ratio = megatron_bubble_ratio(p, m, v)
    return ratio / (1 + ratio)


class Timeline:
    """The events of all ranks of one pipeline step."""

    def __init__(self, events, num_ranks=None):
        self.events = sorted(events, key=lambda e: (e.start, e.rank))
        self.num_ranks = num_ranks or 1 + max(e.rank for e in self.events)
        self.compute = [e for e in self.events if e.kind in COMPUTE_KINDS]
        if not self.compute:
            raise ValueError("a timeline needs at least one forward or backward event")
        self.t0 = min(e.start for e in self.compute)
        self.makespan = max(e.end for e in self.compute) - self.t0

    def bubble_fraction(self):
        """Idle share of ranks x makespan, counting only compute as busy."""
        busy = sum(e.end - e.start for e in self.compute)
        return 1 - busy / (self.num_ranks * self.makespan)

    def inner_bubble_fraction(self):
        """Idle share of each rank's own span, from its first to its last compute: the
        bubble left when step k+1 may start on a rank as soon as it finished step k
        (no optimizer step waiting for every rank). ZB-H2 makes it 0."""
        idle = span = 0.0
        for rank in range(self.num_ranks):
            mine = [e for e in self.compute if e.rank == rank]
            if mine:
                width = max(e.end for e in mine) - min(e.start for e in mine)
                span += width
                idle += width - sum(e.end - e.start for e in mine)
        return idle / span

    def render(self, slot=None):
        """Text picture: one row per rank, one column per `slot` of time
        (default: the shortest compute), `.` where the rank computes nothing."""
        slot = slot or min(e.end - e.start for e in self.compute)
        chunked = any(e.chunk > 0 for e in self.compute)
        width = max(len(_label(e, chunked)) for e in self.compute)
        spans = []  # every event covers at least one column, even when rounding squeezes it
        for e in self.compute:
            first, last = (round((t - self.t0) / slot) for t in (e.start, e.end))
            spans.append((e, first, max(last, first + 1)))
        columns = max(end for _, _, end in spans)
        rows = [["."] * columns for _ in range(self.num_ranks)]
        for e, first, end in spans:
            for column in range(first, end):
                rows[e.rank][column] = _label(e, chunked)
        lines = [f"rank {r} | " + " ".join(cell.ljust(width) for cell in row).rstrip()
                 for r, row in enumerate(rows)]
        split = any(e.kind == "backward_weight" for e in self.compute)
        return "\n".join(lines + _legend(chunked, slot, split))

    def to_chrome_trace(self, us_per_unit=1e6):
        """Chrome trace dict (open in https://ui.perfetto.dev): one process per
        rank, compute on thread 0, send/recv (including time blocked) on thread 1.
        Event times are multiplied by `us_per_unit` (1e6: times in seconds)."""
        trace = []
        for rank in range(self.num_ranks):
            trace.append(_metadata("process_name", rank, 0, f"rank {rank}"))
            trace.append(_metadata("thread_name", rank, 0, "compute"))
            trace.append(_metadata("thread_name", rank, 1, "send/recv"))
        chunked = any(e.chunk > 0 for e in self.compute)
        for e in self.events:
            is_compute = e.kind in COMPUTE_KINDS
            trace.append({
                "name": _label(e, chunked) if is_compute else f"{e.kind} {e.microbatch}",
                "cat": e.kind, "ph": "X", "pid": e.rank, "tid": 0 if is_compute else 1,
                "ts": (e.start - self.t0) * us_per_unit, "dur": (e.end - e.start) * us_per_unit,
                "args": {k: v for k, v in asdict(e).items() if k in ("microbatch", "chunk")},
            })
        return {"traceEvents": trace, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path, us_per_unit=1e6):
        with open(path, "w") as f:
            json.dump(self.to_chrome_trace(us_per_unit), f)


LETTERS = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


def _label(event, chunked):
    """F3 / B3 / W3 = forward / backward / weight gradient of micro-batch 3; with chunks,
    F3b = on chunk b (1)."""
    suffix = "abcdefghijklmnopqrstuvwxyz"[event.chunk] if chunked else ""
    return f"{LETTERS[event.kind]}{event.microbatch}{suffix}"


def _legend(chunked, slot, split):
    chunks = ", letter = model chunk (a = 0, b = 1, ...)" if chunked else ""
    backward = "B = backward's input half, W = its weight half" if split else "B = backward"
    return [f"F = forward, {backward}, number = micro-batch{chunks}, . = idle; "
            f"one column = {slot:g} time unit(s)"]


def _metadata(name, pid, tid, value):
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}
