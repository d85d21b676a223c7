"""DualPipe and DualPipeV in the planner: which stages a rank holds, their bubble and activations.

DeepSeek-V3 (technical report, 2024, section 3.2.1, table 2). Per device, with F, B, W the costs of one
stage's forward, whole backward and weight part (B = B_in + W), F&B a forward and a backward chunk run as a pair:
    bubble       1F1B (PP−1)(F+B)    ZB1P (PP−1)(F+B−2W)    DualPipe (PP/2−1)(F&B+B−3W)
    parameters   1×                   1×                     2×
    activations  PP                   PP                     PP+1   (micro-batches of one stage)
    dualpipe   bidirectional, PP = pp stages on pp ranks (pp even): rank r holds stages r and pp−1−r,
               two copies of the model; half the micro-batches run each way, so each copy computes m/2
               of them and rank 0 and rank pp−1 both hold the embedding and the head.
    dualpipev  the V (pipeline.dualpipe): 2·pp stages on pp ranks, rank r holding stages r and 2pp−1−r,
               one copy; every micro-batch crosses both of a rank's stages, and rank 0 holds the
               embedding (stage 0) and the head (stage 2pp−1). Its bubble is the formula's with PP = 2pp
               stages of half a rank's work. Its activations are counted from its own action lists
               (pipeline.checker's peak stored (micro-batch, chunk) graphs: 2pp+1 on rank 0), in stages.
F&B = F + B: the planner does not model the overlap of a pair (on a CPU the pair runs in sequence; on
GPUs it hides the all-to-alls and pipeline sends, which these dense models do not have), so the gain it
sees is the bubble. The formula holds where the input part equals the forward and W fits in its gaps
(B − W = F ≥ W) and m reaches the steady state (m ≥ 3·PP − 4 for DualPipe, 3·PP/2 − 2 for the V; with
fewer the lists idle less, so from 2·pp on the formula errs high); the planner's stage costs are there
by construction: F = B_in = W by flops (with recomputation the W's run inside B, W = 0, as for the
zero-bubble schedules).
"""
from functools import cache

from ..pipeline.checker import check_schedule
from ..pipeline.registry import get_schedule, placement_of

DUAL = ("dualpipe", "dualpipev")


def stage_count(schedule, pp):
    """Model stages of a pp-rank pipeline: 2·pp for the V, pp otherwise."""
    return 2 * pp if schedule == "dualpipev" else pp


def held_stages(schedule, pp, rank):
    """[(stage, share)]: the stages `rank` holds and the fraction of the m micro-batches each computes."""
    if schedule == "dualpipev":
        return [(rank, 1.0), (2 * pp - 1 - rank, 1.0)]
    if schedule == "dualpipe":
        return [(rank, 0.5), (pp - 1 - rank, 0.5)]
    return [(rank, 1.0)]


def per_rank(schedule, pp, values):
    """A per-stage quantity summed onto the ranks, each stage weighted by its share of the micro-batches."""
    return [sum(share * values[stage] for stage, share in held_stages(schedule, pp, rank)) for rank in range(pp)]


def dual_error(schedule, pp, m, n_layer):
    """Why a dual layout cannot run (one line), or None."""
    if schedule == "dualpipe" and pp % 2:
        return f"dualpipe needs an even pp (rank r holds stages r and pp-1-r), got pp={pp}"
    if m < 2 * pp:
        return f"{schedule} needs at least 2·pp = {2 * pp} micro-batches, got m={m}"
    if stage_count(schedule, pp) > n_layer:
        return f"{schedule} on pp={pp} ranks cuts {stage_count(schedule, pp)} stages from n_layer={n_layer} blocks"
    return None


def table2_bubble(stages, forward, backward, weight):
    """Idle time per device of DualPipe over `stages` stages (table 2; F&B = F + B: no overlap)."""
    return (stages / 2 - 1) * (forward + 2 * backward - 3 * weight)


def dual_bubble_slots(schedule, pp, recompute=False):
    """The bubble in units of the slowest rank's time per micro-batch, t: a stage costs t/2 in the V
    (each micro-batch crosses two), t in DualPipe; F : B : W = 1 : 2 : 1 by flops, with recomputation
    1 : 3 : 0 (the recomputed forward inside B, W not deferred)."""
    forward, backward, weight = (1 / 4, 3 / 4, 0.0) if recompute else (1 / 3, 2 / 3, 1 / 3)
    scale = pp / stage_count(schedule, pp)
    return table2_bubble(stage_count(schedule, pp), scale * forward, scale * backward, scale * weight)


@cache
def v_peak_graphs(pp, m):
    """Per rank, the V's peak stored (micro-batch, chunk) graphs, counted from its action lists."""
    report = check_schedule(get_schedule("dualpipev", pp, m, 2), pp, m, 2, placement=placement_of("dualpipev"))
    return tuple(report.peak_activations)


def in_flight_stages(schedule, m, pp, rank):
    """Stage-micro-batches whose activations `rank` holds at its peak (table 2's PP+1 for DualPipe)."""
    if schedule == "dualpipev":
        return v_peak_graphs(pp, m)[rank]
    return min(m, pp + 1)
