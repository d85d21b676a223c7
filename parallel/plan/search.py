"""Enumerate every layout of a device count, drop what cannot run or fit, rank the rest.

A layout is dp × tp × pp (× cp) = devices with: tp dividing n_head (hence d_model and 4·d_model),
tp ≤ devices per node unless `allow_inter_node_tp`, pp ≤ n_layer, batch divisible by
dp·m, and with `max_cp` > 1 every cp ≤ max_cp whose zigzag layout divides the sequence
(2·cp chunks). For each: every micro-batch count m, recomputation on/off, sequence parallel
on/off (only when tp > 1), ZeRO-1 on/off (only when dp·cp > 1); with schedule "any" every schedule
of layout.SCHEDULES (DualPipe(V) where plan.dual.dual_error lets them run). A mixture of experts also
tries every ep dividing dp and E (with cp = 1), and neither sequence parallelism nor ZeRO-2/3,
which HybridGPT does not compose with experts.

`longest_sequence` answers the other question: the longest sequence some layout fits.

The search is bounded: before costing anything it counts its steps (`search_steps`) and
refuses, naming the count, a search of more than MAX_SEARCH_STEPS (under a minute).
"""
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cache
from itertools import product
from math import isqrt

from .cost import estimate
from .dual import DUAL, dual_error
from .flops import stage_flops
from .layout import SCHEDULES, Layout
from .model import has_experts
from .moe import device_limit_fits
from .profiles import load_profile
from .stage_split import SPLITS, stage_split

# Each candidate's estimate costs every pipeline stage, and each stage walks the pp-long balance
# list and its own blocks: about pp² + n_layer steps of ≈ 0.4 µs on a laptop core.
MAX_SEARCH_STEPS = 10**8


@cache
def divisors(n):
    """The divisors of n, ascending, found in √n trials (once per n)."""
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


@dataclass
class Plan:
    ranked: list                        # Estimates that fit, fastest first
    rejected: Counter = field(default_factory=Counter)   # reason -> count
    smallest_rejected: object = None    # the Estimate that came closest to fitting


def grids(config, devices, batch, devices_per_node, allow_inter_node_tp, rejected, max_cp=1):
    """(dp, tp, pp, cp) that satisfy the divisibility rules; count the others by rule."""
    for tp, cp in product(divisors(devices), [c for c in divisors(devices) if c <= max_cp]):
        if devices % (tp * cp):
            continue
        for pp in divisors(devices // (tp * cp)):
            dp = devices // (tp * pp * cp)
            if config.block_size % (2 * cp) and cp > 1:
                rejected[f"grids with seq={config.block_size} not divisible by 2·cp"] += 1
            elif config.n_head % tp:
                rejected[f"grids with n_head={config.n_head} not divisible by tp"] += 1
            elif tp > devices_per_node and not allow_inter_node_tp:
                rejected[f"grids with tp > {devices_per_node} devices per node"] += 1
            elif pp > config.n_layer:
                rejected[f"grids with pp > n_layer={config.n_layer}"] += 1
            elif batch % dp:
                rejected[f"grids with batch={batch} not divisible by dp"] += 1
            else:
                yield dp, tp, pp, cp


def flag_choices(tp, replicas, experts=False):
    """(recompute, sequence_parallel, zero) of a grid: sp needs tp > 1, ZeRO needs dp·cp > 1;
    with experts no sp and ZeRO-1 at most."""
    return [(recompute, sp, zero) for recompute, sp, zero in product((False, True), (False, True), (0, 1, 2, 3))
            if not (sp and (tp == 1 or experts)) and not (zero and replicas == 1) and not (experts and zero > 1)]


def expert_parallel_sizes(config, dp, cp):
    """The ep a grid can take: 1, and with experts every divisor of dp and E (when cp = 1)."""
    return [ep for ep in divisors(dp) if ep == 1 or (has_experts(config) and config.n_experts % ep == 0 and cp == 1)]


def candidate_layouts(config, dp, tp, pp, batch, schedule, cp=1, attention="dense", max_ranks=None):
    """The layouts of a grid: each ep, micro-batch count and flags; under a device limit of
    `max_ranks` M ranks per token, only the ep whose ranks hold top-k on M of them."""
    experts = has_experts(config)
    for ep, name in product(expert_parallel_sizes(config, dp, cp), SCHEDULES if schedule == "any" else [schedule]):
        if not device_limit_fits(config, ep, max_ranks):
            continue
        for m in divisors(batch // dp):
            for recompute, sp, zero in flag_choices(tp, dp * cp, experts):
                yield Layout(dp, tp, pp, m, recompute, sp, zero, name, cp, ep, attention, max_ranks)


def search_steps(config, grid_list, batch, schedules=1):
    """The steps costing every candidate of `grid_list` under `schedules` schedules takes: pp² + n_layer per candidate."""
    experts = has_experts(config)
    return sum(len(expert_parallel_sizes(config, dp, cp)) * len(divisors(batch // dp)) * schedules
               * len(flag_choices(tp, dp * cp, experts)) * (pp * pp + config.n_layer) for dp, tp, pp, cp in grid_list)


def check_search_size(steps, searches=1):
    """Refuse (ValueError) `searches` searches of `steps` steps each beyond MAX_SEARCH_STEPS in all."""
    if steps * searches > MAX_SEARCH_STEPS:
        times = f"{searches} searches × " if searches > 1 else ""
        raise ValueError(f"the search would take {times}{steps:,} steps, over its bound of {MAX_SEARCH_STEPS:,} "
                         "(about a minute): give fewer --devices or --n-layer, a --batch with fewer divisors, "
                         "or a smaller --max-cp")


def plan(config, devices, batch, profile, memory_bytes=None, dtype="float32",
         schedule="1f1b", allow_inter_node_tp=False, max_cp=1, compress="none", local_steps=1, searches=1,
         attention="dense", max_ranks=None, splits=False):
    """All fitting layouts ranked by `rank_key`; rejections counted by reason.

    `profile` is a profile dict or a name; `memory_bytes` defaults to the profile's;
    `max_cp`: also try context parallelism up to this many ranks; `searches`: how many searches
    of this size the caller runs (ValueError if they exceed MAX_SEARCH_STEPS together);
    `attention`: the kernel every layout computes attention with (Layout.attention: flash keeps
    no probabilities, so its activations hold no s² term; the time model is the same); `max_ranks`:
    device-limited routing, M ranks per token at most (the trainer's --max-ranks-per-token); `splits`:
    also try each pipeline's uneven splits of the blocks (`stage_splits`)."""
    profile = load_profile(profile) if isinstance(profile, str) else profile
    if devices < 1 or batch < 1:
        raise ValueError(f"devices={devices} and batch={batch} must be positive")
    limit = memory_bytes if memory_bytes is not None else profile["memory_gib"] * 2**30
    result = Plan([])
    grid_list = list(grids(config, devices, batch, profile["devices_per_node"], allow_inter_node_tp,
                           result.rejected, max_cp))
    tries = (len(SCHEDULES) if schedule == "any" else 1) * (len(SPLITS) if splits else 1)
    check_search_size(search_steps(config, grid_list, batch, tries), searches)
    for dp, tp, pp, cp in grid_list:
        unfit = [ep for ep in expert_parallel_sizes(config, dp, cp) if not device_limit_fits(config, ep, max_ranks)]
        if unfit:
            result.rejected[f"ep choices that cannot hold top-k on --max-ranks-per-token {max_ranks} ranks"] += len(unfit)
        for layout in candidate_layouts(config, dp, tp, pp, batch, schedule, cp, attention, max_ranks):
            if layout.zero and (compress != "none" or local_steps > 1):
                result.rejected["ZeRO candidates (compression and local SGD need whole replicas)"] += 1
                continue
            if layout.schedule in DUAL and dual_error(layout.schedule, pp, layout.micro_batches, config.n_layer):
                result.rejected["DualPipe(V) candidates with odd pp, m < 2·pp or too few blocks"] += 1
                continue
            for balance in stage_splits(config, layout, batch) if splits else [None]:
                est = estimate(config, layout, batch, profile, dtype, balance, compress, local_steps)
                if est.memory["total"] <= limit:
                    result.ranked.append(est)
                    continue
                result.rejected[f"candidates out of memory (> {limit / 2**30:.3g} GiB)"] += 1
                if result.smallest_rejected is None or \
                        est.memory["total"] < result.smallest_rejected.memory["total"]:
                    result.smallest_rejected = est
    result.ranked.sort(key=rank_key)
    return result


def stage_splits(config, layout, batch):
    """None (the even split) and each different split of stage_split.SPLITS for a one-stage-per-rank
    pipeline: balanced by the closed form's flops (a block's, the head's; the embedding costs none), and
    the ends one block lighter. DualPipe(V) keep the even split (their ranks hold two stages)."""
    if layout.pp == 1 or layout.schedule in DUAL:
        return [None]
    tokens = batch // (layout.dp * layout.micro_batches) * config.block_size // layout.cp
    block = stage_flops(config, 1, tokens, layout.tp, layout.recompute, False)
    head = stage_flops(config, 0, tokens, layout.tp, layout.recompute, True)
    cuts = {tuple(stage_split(config.n_layer, layout.pp, split, block, 0.0, head)) for split in SPLITS}
    even = tuple(stage_split(config.n_layer, layout.pp, "even", block, 0.0, head))
    return [None] + sorted(list(cut) for cut in cuts - {even})


def rank_key(est):
    """Fastest first; among equal times the simplest (fewest flags, fewest micro-batches),
    then the smallest memory: ZeRO-1 and extra micro-batches cost no modelled time, so
    they are only worth it when needed to fit."""
    flags = est.layout.recompute + est.layout.sequence_parallel + (est.layout.zero > 0)
    return float(f"{est.time['total']:.9g}"), flags, est.layout.micro_batches, est.memory["total"]


def longest_sequence(config, devices, batch, profile, memory_bytes=None, dtype="float32",
                     schedule="1f1b", allow_inter_node_tp=False, max_cp=1, limit=2**24, attention="dense"):
    """(s, fastest Estimate at s): the longest sequence s, a multiple of 2·max_cp (so every
    cp up to max_cp can cut it), that some layout fits in memory; (0, None) if none does.
    Memory grows with s, so doubling finds a bracket and bisection its end."""
    step = 2 * max_cp
    searches = 2 * (limit // step).bit_length()  # at most: doubling up to the limit, then bisecting

    def best(multiple):
        config_s = replace(config, block_size=multiple * step)
        ranked = plan(config_s, devices, batch, profile, memory_bytes, dtype, schedule,
                      allow_inter_node_tp, max_cp, searches=searches, attention=attention).ranked
        return ranked[0] if ranked else None

    if best(1) is None:
        return 0, None
    low, high = 1, 2
    while high * step <= limit and best(high) is not None:
        low, high = high, 2 * high
    while high - low > 1:  # best(low) fits, best(high) does not (or is past the limit)
        middle = (low + high) // 2
        low, high = (middle, high) if best(middle) is not None else (low, middle)
    return low * step, best(low)
