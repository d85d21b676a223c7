"""Replaying a pipeline schedule when the ranks share the cores.

Four ranks on two cores: while all four compute, each gets at most half a core; in a
pipeline bubble, when only one stage computes, its ranks get more (how much more depends
on what else runs on the machine, and on how hard the waiting ranks poll). So a forward's
duration depends on what the other stages are doing at the same moment — the fixed costs
of `pipeline.checker` cannot say that. This replay walks global time instead: every
computing rank progresses at

    rate(n) = 1 + (a − 1)·(ranks − n)/(ranks − 1)        n = ranks computing now

times the speed its costs were measured at (all `ranks` computing at once, as the
validation measures them): 1 when everyone computes, `a` — the measured speed-up of one
rank computing while the others wait in MPI (`alone_speedup`) — when one computes alone,
in between linearly. A message (send/recv pair) takes α + N·β and no core. With a = 1
(a core per rank, an idle machine) the replay is the checker's simulation (the tests check
both agree). `ranks_per_stage` ranks (dp·tp of them) run each stage in lockstep.
"""
from ..pipeline.checker import _matches
from ..pipeline.timeline import Event


def rate(computing, ranks, alone_speedup):
    """Speed of a computing rank relative to all `ranks` computing, with `computing` busy."""
    if ranks == 1:
        return 1.0
    return 1.0 + (alone_speedup - 1.0) * (ranks - computing) / (ranks - 1)


def replay(schedule, times, message_seconds, ranks_per_stage=1, alone_speedup=1.0, placement="loop"):
    """Events of `schedule` (one action list per stage) with times[stage][kind] seconds
    measured with every rank computing (see the module doc for `alone_speedup`); a rank of
    several chunks (placement "v": pipeline.schedules.PLACEMENTS) has times[stage][chunk][kind]."""
    p = len(schedule)
    ranks = p * ranks_per_stage
    position, now, events = [0] * p, 0.0, []
    work = [None] * p            # (action, start, remaining seconds at rate 1) of a running compute
    message = [None] * p         # (action, start, end) of a running send/recv

    def current(stage):
        return schedule[stage][position[stage]] if position[stage] < len(schedule[stage]) else None

    def finish(stage, action, start):
        events.append(Event(stage, action.kind, action.microbatch, action.chunk, start, now))
        position[stage] += 1

    while any(current(s) is not None for s in range(p)):
        for stage in range(p):            # start what can start now
            a = current(stage)
            if a is None or work[stage] or message[stage]:
                continue
            if a.is_compute:
                costs = times[stage][a.chunk] if isinstance(times[stage], (list, tuple)) else times[stage]
                work[stage] = (a, now, costs[a.kind])
            elif not message[a.peer] and not work[a.peer] and current(a.peer) is not None \
                    and _matches(stage, a, a.peer, current(a.peer), p, placement):
                end = now + message_seconds
                message[stage], message[a.peer] = (a, now, end), (current(a.peer), now, end)
        busy = [s for s in range(p) if work[s]]
        if not busy and not any(message):
            raise RuntimeError(f"the schedule is stuck at positions {position}")
        speed = rate(len(busy) * ranks_per_stage, ranks, alone_speedup) if busy else 1.0
        step = min([work[s][2] / speed for s in busy] + [m[2] - now for m in message if m])
        now += step
        for s in busy:
            a, start, left = work[s]
            left -= step * speed
            work[s] = (a, start, left) if left > 1e-12 else None
            if work[s] is None:
                finish(s, a, start)
        for s in range(p):
            if message[s] and message[s][2] <= now + 1e-15:
                a, start, _ = message[s]
                message[s] = None
                finish(s, a, start)
    return events
