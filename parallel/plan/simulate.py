"""Step time by simulation: replay the pipeline schedule's action lists with measured costs.

The closed form of cost.py charges every stage the slowest one's time and a bubble of
(p − 1)·t_stage. This module runs the schedule instead: it replays every rank's list of the
actual schedule (`get_schedule`, the lists the executor runs) in global time
(shared_cores.replay: `pipeline.checker`'s simulation when every rank has a core, and
ranks that share cores speed up while others idle), each forward and backward taking its
stage's measured time, each send/recv one α–β message. Then, as HybridGPT does after its last backward
(`finish_grad_sync`: the dp buckets are all started there, so they do not overlap the
backward), the dp gradient reduction and the optimizer step; the step ends when the
slowest rank is done.

A stage's forward of one micro-batch of b sequences on one tp rank:
    [first]  embedding + 1 all-reduce of b·s·h (vocab-parallel lookup)
    L ×      block + 2 all-reduces of b·s·h (after attention's and the MLP's row-parallel
             linear: Megatron's g)
    [last]   final LayerNorm, lm_head and loss + 3 all-reduces of b·s floats (vocab-parallel
             cross-entropy: max, sum of exponentials, target logit)
and its backward: the parts' backwards, 2 all-reduces per block and 1 into the head
(Megatron's f); with activation recomputation the backward first runs the stage's forward
again (HybridGPT recomputes the whole stage, its collectives included). The parts'
seconds (`PartCosts`) are measured on this machine, on the local shapes one tp rank
computes (parallel/plan/parts.py), so compute is not a peak rate times an efficiency but
what these kernels take here.
"""
from dataclasses import dataclass

from ..alpha_beta import ring_all_reduce, send_recv
from ..pipeline.registry import get_schedule, placement_of
from .cost import dp_seconds, link
from .dual import held_stages, stage_count
from .layout import get_precision
from .memory import micro_batch_size, rank_units
from .model import stage_layers
from .shared_cores import replay


@dataclass(frozen=True)
class PartCosts:
    """Measured seconds of one micro-batch on one tp rank, forward and backward of each part,
    and of the optimizer step per parameter held."""
    embed: tuple           # (forward, backward)
    block: tuple
    head: tuple
    optimizer_per_param: float


@dataclass
class SimulatedStep:
    total: float           # seconds of the step: the slowest rank's end
    stage_ends: list       # when each pipeline stage finished its last action
    stage_times: list      # (forward, backward) seconds of one micro-batch per stage
    dp: float
    optimizer: list        # per stage
    events: list           # the pipeline's Events (checker.Event), for a timeline


def stage_times(config, layout, b, parts, balance, tp_all_reduce):
    """(forward, backward) seconds of one micro-batch on each stage (2·pp of them in the V: plan.dual),
    tp collectives included."""
    activation, small = tp_all_reduce(b * config.block_size * config.d_model), tp_all_reduce(b * config.block_size)
    times, stages = [], stage_count(layout.schedule, layout.pp)
    for stage, blocks in enumerate(stage_layers(config.n_layer, stages, balance)):
        first, last = stage == 0, stage == stages - 1
        forward = blocks * (parts.block[0] + 2 * activation) + first * (parts.embed[0] + activation) \
            + last * (parts.head[0] + 3 * small)
        backward = blocks * (parts.block[1] + 2 * activation) + first * parts.embed[1] + last * (parts.head[1] + activation)
        times.append((forward, backward + forward * layout.recompute))
    return times


def for_group(profile, collectives, n):
    """`profile` with the links of its collectives fitted on groups of n ranks, where measured."""
    fitted = (collectives or {}).get(n)
    if fitted is None:
        return profile
    return {**profile, "intra": fitted, "inter": fitted}


def simulate_step(config, layout, batch, parts, profile, balance=None, dtype="float32", alone_speedup=1.0,
                  collectives=None):
    """The SimulatedStep of `layout` (a plan.Layout) with measured `parts` for its micro-batch
    size and tp; the links are the profile's, as in cost.estimate. `alone_speedup`: how much
    faster one rank computes while the others wait than when all compute (the ranks share
    cores, shared_cores.py; `parts` measured with all computing); 1: a core per rank.
    `collectives`: {group size n: {"alpha_us", "bandwidth_gbps"}} fitted to all-reduces on
    groups of n ranks (validate_worker.measure_collectives), for the tp and dp collectives
    of groups of that size instead of the profile's link."""
    precision = get_precision(dtype)
    b, p, m = micro_batch_size(batch, layout), layout.pp, layout.micro_batches
    _, tp_alpha, tp_beta = link(for_group(profile, collectives, layout.tp), 1, layout.tp)
    _, pp_alpha, pp_beta = link(profile, layout.tp * layout.dp, p)

    def tp_all_reduce(elements):
        return ring_all_reduce(layout.tp, elements * precision.activation_bytes, tp_alpha, tp_beta) if layout.tp > 1 else 0.0

    times = stage_times(config, layout, b, parts, balance, tp_all_reduce)
    message = send_recv(b * config.block_size * config.d_model * precision.activation_bytes, pp_alpha, pp_beta)
    costs = [{"forward": f, "backward": bw, "backward_input": bw / 2, "backward_weight": bw / 2} for f, bw in times]
    chunks = [[costs[stage] for stage, _ in held_stages(layout.schedule, p, rank)] for rank in range(p)]
    events = replay(get_schedule(layout.schedule, p, m, len(chunks[0])), chunks, message, layout.dp * layout.tp,
                    alone_speedup, placement_of(layout.schedule))
    ends = [max(e.end for e in events if e.rank == stage) for stage in range(p)]
    dp, _ = dp_seconds(config, layout, for_group(profile, collectives, layout.dp), precision, balance)  # closed form
    optimizer = [sum(map(sum, rank_units(config, layout.tp, p, rank, balance, schedule=layout.schedule)))
                 * parts.optimizer_per_param / (layout.dp if layout.zero else 1) for rank in range(p)]
    total = max(end + dp + opt for end, opt in zip(ends, optimizer))
    return SimulatedStep(total, ends, times, dp, optimizer, events)
