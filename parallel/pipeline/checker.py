"""Run all ranks' action lists against each other, without any model.

`check_schedule` is a small discrete-event simulation of the semantics in
`schedules.py`: computes never wait, a receive waits for its data, and a send
waits until the peer posts the matching receive (rendezvous). Along the way
it proves, or raises a `ScheduleError` naming the first violation:

  * no deadlock: if every unfinished rank is blocked, a `ScheduleDeadlockError`
    names the chain of waits (rank, action) and the cycle it closes;
  * happens-before: forward(mb, s) after forward(mb, s-1), backward(mb, s)
    after backward(mb, s+1), backward(mb, s) after forward(mb, s), each
    compute after receiving its input, each send after computing its data;
    with the backward split, B plays backward's part and W(mb, s) comes
    after B(mb, s);
  * matching: every send meets exactly one receive with the same
    (source, destination, kind, micro-batch, chunk);
  * completeness: every rank forwards and backwards every (mb, chunk)
    exactly once (B and W once each), so all gradients are complete before
    the optimizer step, which comes after every rank's list; under the
    "mirror" placement (DualPipe) a chunk runs only its direction's half of
    the micro-batches (placement.microbatches_of), and nothing else.

The same simulation gives each action's start and end time for given costs
(forward 1, backward 2 of which W is `weight_time` = 1, so F = B = W;
communication 0 by default) as `Event`s for a `Timeline`, and each rank's
peak number of stored activations, counted in (micro-batch, chunk) units:
forwards done whose backward is not. A B keeps its micro-batch counted until
its W (what W still needs, the linear layers' inputs and output gradients,
stays alive); `peak_weight_pending` counts those B-done, W-pending ones alone.
"""
from dataclasses import dataclass

from .placement import microbatches_of, num_stages, rank_and_chunk, stage_of
from .schedules import KINDS, PRODUCES, Action, prerequisites
from .timeline import Event


class ScheduleError(ValueError):
    """A schedule that would compute wrong gradients or never finish."""


class ScheduleDeadlockError(ScheduleError):
    """Every unfinished rank is blocked; `cycle` lists the (rank, action) waits."""

    def __init__(self, message, cycle):
        super().__init__(message)
        self.cycle = cycle


@dataclass
class ScheduleReport:
    events: list              # Event per action, in simulated time
    peak_activations: list    # per rank, max stored (micro-batch, chunk) activations
    peak_weight_pending: list  # per rank, max (micro-batch, chunk) between their B and W


def check_schedule(schedule, p, m, v=1, forward_time=1.0, backward_time=2.0, comm_time=0.0, weight_time=None,
                   placement="loop"):
    """Check `schedule` (one action list per rank) for p ranks, m micro-batches,
    v chunks per rank placed as `placement` (placement.PLACEMENTS); return its
    simulated events and peak activations.
    backward_time is a whole backward's; weight_time (default half of it) its W part.
    Each time is one number for every rank or a list of one per rank."""
    _check_static(schedule, p, m, v, placement)
    forwards = _per_rank(forward_time, p, "forward_time")
    backwards = _per_rank(backward_time, p, "backward_time")
    weights = _per_rank(weight_time, p, "weight_time")
    run = _Run(schedule, p, v, m, [_costs(f, b, w) for f, b, w in zip(forwards, backwards, weights)], comm_time,
               placement)
    run.until_blocked()
    run.raise_if_stuck()
    run.check_complete()
    return ScheduleReport(run.events, run.peak, run.peak_pending)


def _per_rank(value, p, name):
    """A cost given once for all ranks, or one per rank (stages of unequal work)."""
    if isinstance(value, (list, tuple)):
        if len(value) != p:
            raise ValueError(f"{name} has {len(value)} entries for p={p} ranks")
        return list(value)
    return [value] * p


def _costs(forward_time, backward_time, weight_time):
    weight_time = backward_time / 2 if weight_time is None else weight_time
    return {"forward": forward_time, "backward": backward_time,
            "backward_input": backward_time - weight_time, "backward_weight": weight_time}


def simulate(schedule, p, m, v=1, forward_time=1.0, backward_time=2.0, comm_time=0.0, weight_time=None,
             placement="loop"):
    """The `Event`s of a checked schedule under the given costs."""
    return check_schedule(schedule, p, m, v, forward_time, backward_time, comm_time, weight_time, placement).events


def _check_static(schedule, p, m, v, placement):
    """Shapes, ranges and peers, before anything runs."""
    if len(schedule) != p:
        raise ScheduleError(f"schedule has {len(schedule)} rank lists, expected p={p}")
    last = num_stages(p, v, placement) - 1
    for rank, actions in enumerate(schedule):
        for a in actions:
            where = f"rank {rank}: {a}"
            if not isinstance(a, Action) or a.kind not in KINDS:
                raise ScheduleError(f"rank {rank}: {a!r} is not an Action with kind in {KINDS}")
            if not (0 <= a.microbatch < m and 0 <= a.chunk < v):
                raise ScheduleError(f"{where}: micro-batch or chunk out of range (m={m}, v={v})")
            if a.microbatch not in microbatches_of(a.chunk, m, placement):
                raise ScheduleError(f"{where}: chunk {a.chunk} runs micro-batches "
                                    f"{list(microbatches_of(a.chunk, m, placement))} only ({placement!r} placement)")
            if a.is_compute != (a.peer is None):
                raise ScheduleError(f"{where}: compute actions have no peer, send/recv need one")
            if not a.is_compute:
                stage = stage_of(rank, a.chunk, p, placement)
                neighbour = _neighbour_stage(a.kind, stage)
                if not 0 <= neighbour <= last:
                    raise ScheduleError(f"{where}: stage {stage} has no "
                                        f"neighbour stage {neighbour} (stages 0..{last})")
                owner = rank_and_chunk(neighbour, p, placement, a.chunk)[0]
                if a.peer != owner or owner == rank:
                    raise ScheduleError(f"{where}: stage {neighbour} lives on rank {owner}, not rank {a.peer}"
                                        + (" (same rank: handed over in memory, no message)" if owner == rank else ""))


def _neighbour_stage(kind, stage):
    """The stage at the other end of a send/recv of `stage`."""
    return stage + 1 if kind in ("send_fwd", "recv_bwd") else stage - 1


class _Run:
    """State of the simulated ranks: position in their list and clock."""

    def __init__(self, schedule, p, v, m, compute_time, comm_time, placement):
        self.schedule, self.p, self.v, self.m, self.placement = schedule, p, v, m, placement
        self.last_stage = num_stages(p, v, placement) - 1
        self.compute_time, self.comm_time = compute_time, comm_time
        self.position, self.clock = [0] * p, [0.0] * p
        self.done = set()                        # (kind, mb, stage) computed, kinds as in PRODUCES
        self.sent = set()                        # (rank, kind, mb, chunk) sent
        self.received = set()                    # (rank, kind, mb, chunk) received
        self.stored, self.peak = [0] * p, [0] * p
        self.pending, self.peak_pending = [0] * p, [0] * p
        self.events = []

    def current(self, rank):
        actions = self.schedule[rank]
        return actions[self.position[rank]] if self.position[rank] < len(actions) else None

    def until_blocked(self):
        progressed = True
        while progressed:
            progressed = False
            for rank in range(self.p):
                while self.step(rank):
                    progressed = True

    def step(self, rank):
        """Run `rank`'s next action if it can run now; False if blocked or done."""
        a = self.current(rank)
        if a is None:
            return False
        if a.is_compute:
            self.compute(rank, a)
            return True
        self.check_communication(rank, a)
        b = self.current(a.peer)
        if b is None or not _matches(rank, a, a.peer, b, self.p, self.placement):
            return False
        start = max(self.clock[rank], self.clock[a.peer])
        for r, action in ((rank, a), (a.peer, b)):
            (self.sent if action.kind.startswith("send") else self.received).add(
                (r, action.kind, action.microbatch, action.chunk))
            self.record(r, action, self.clock[r], start + self.comm_time)
        return True

    def record(self, rank, action, start, end):
        self.events.append(Event(rank, action.kind, action.microbatch, action.chunk, start, end))
        self.clock[rank] = end
        self.position[rank] += 1

    def compute(self, rank, a):
        stage = stage_of(rank, a.chunk, self.p, self.placement)
        produced = [(kind, a.microbatch, stage) for kind in PRODUCES[a.kind]]
        if any(work in self.done for work in produced):
            raise ScheduleError(f"rank {rank}: {a} runs twice")
        for kind, mb, s in prerequisites(a.kind, a.microbatch, stage, self.last_stage):
            if (kind, mb, s) not in self.done:
                raise ScheduleError(f"rank {rank}: {a} (stage {stage}) runs before "
                                    f"{kind} of micro-batch {mb} at stage {s}")
        message = {"forward": "recv_fwd", "backward": "recv_bwd", "backward_input": "recv_bwd"}.get(a.kind)
        upstream = stage - 1 if a.kind == "forward" else stage + 1
        remote = (0 <= upstream <= self.last_stage
                  and rank_and_chunk(upstream, self.p, self.placement, a.chunk)[0] != rank)
        if message and remote and (rank, message, a.microbatch, a.chunk) not in self.received:
            raise ScheduleError(f"rank {rank}: {a} runs without its input: no {message} "
                                f"of micro-batch {a.microbatch}, chunk {a.chunk} before it")
        self.done.update(produced)
        self.count_stored(rank, a.kind)
        self.record(rank, a, self.clock[rank], self.clock[rank] + self.compute_time[rank][a.kind])

    def count_stored(self, rank, kind):
        """A forward stores a micro-batch; the backward, or else the W, frees it."""
        self.stored[rank] += {"forward": 1, "backward": -1, "backward_weight": -1}.get(kind, 0)
        self.pending[rank] += {"backward_input": 1, "backward_weight": -1}.get(kind, 0)
        self.peak[rank] = max(self.peak[rank], self.stored[rank])
        self.peak_pending[rank] = max(self.peak_pending[rank], self.pending[rank])

    def check_communication(self, rank, a):
        key = (rank, a.kind, a.microbatch, a.chunk)
        if key in self.sent or key in self.received:
            raise ScheduleError(f"rank {rank}: {a} happens twice")
        computed = {"send_fwd": "forward", "send_bwd": "backward_input"}.get(a.kind)
        stage = stage_of(rank, a.chunk, self.p, self.placement)
        if computed and (computed, a.microbatch, stage) not in self.done:
            what = "forward" if computed == "forward" else "backward (or backward_input)"
            raise ScheduleError(f"rank {rank}: {a} before its {what} was computed")

    def raise_if_stuck(self):
        """If some rank has not finished, every such rank is blocked in a
        send/recv: follow who waits for whom until a rank repeats."""
        waiting = [r for r in range(self.p) if self.current(r) is not None]
        if not waiting:
            return
        chain, rank = [], waiting[0]
        while rank not in [r for r, _ in chain] and self.current(rank) is not None:
            chain.append((rank, self.current(rank)))
            rank = self.current(rank).peer
        steps = " -> ".join(f"rank {r} blocks in {a}" for r, a in chain)
        if self.current(rank) is None:
            raise ScheduleDeadlockError(f"deadlock: {steps}, but rank {rank} has finished its list "
                                f"(no matching action)", chain)
        cycle = chain[[r for r, _ in chain].index(rank):]
        raise ScheduleDeadlockError(f"deadlock: {steps} -> back to rank {rank} (wait-for cycle of "
                            f"ranks {[r for r, _ in cycle]})", cycle)

    def check_complete(self):
        for rank in range(self.p):
            for chunk in range(self.v):
                stage = stage_of(rank, chunk, self.p, self.placement)
                for kind, name in (("forward", "forward"), ("backward_input", "backward"),
                                   ("backward_weight", "backward_weight")):
                    missing = [mb for mb in microbatches_of(chunk, self.m, self.placement)
                               if (kind, mb, stage) not in self.done]
                    if missing:
                        raise ScheduleError(f"rank {rank} never runs {name} of micro-batches "
                                            f"{missing} on chunk {chunk}: gradients incomplete "
                                            f"before the optimizer step")


def _matches(rank, a, peer, b, p, placement="loop"):
    """Is `b` (peer's current action) the receive/send matching `a`?"""
    pairs = {("send_fwd", "recv_fwd"), ("recv_fwd", "send_fwd"),
             ("send_bwd", "recv_bwd"), ("recv_bwd", "send_bwd")}
    return ((a.kind, b.kind) in pairs and b.peer == rank and a.microbatch == b.microbatch
            and _neighbour_stage(a.kind, stage_of(rank, a.chunk, p, placement)) == stage_of(peer, b.chunk, p, placement))
