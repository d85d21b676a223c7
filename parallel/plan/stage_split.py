"""Stages of unequal size on a GPU cluster (plan.cluster): which blocks each pipeline stage holds.

Real runs rarely divide the layers evenly (70 layers on 12 stages), and the ends are not blocks:
the first stage also runs the embedding, the last the lm_head and the cross-entropy. Two splits:
    even      Megatron-LM's default where pp divides n_layer; otherwise the first n_layer mod pp
              stages hold one block more (what parallel.pipeline.partition's balance list expresses)
    balanced  the contiguous split whose slowest stage is fastest, the ends costed on their stages
              (Megatron's --decoder-first/last-pipeline-num-layers set the ends' counts by hand to
              the same end). With equal blocks it needs no search over cuts (partition.balance_by_cost's
              dynamic programme, O(p·n²), is too slow for the planner's search): a time T is enough
              when every stage fits ⌊(T − its ends)/t_block⌋ ≥ 1 blocks and these add up to n; the
              least such T is one of k·t_block + (0, t_embed or t_head), found by bisection.
    ends      Megatron-LM's hand setting of those flags as often used (Llama 3's 126 layers on 16 stages):
              the first and last stage a block fewer than the middle ones, which share the rest
              (even where the layers are too few, n_layer < 2·pp − 2, or pp ≤ 2)
Each stage's time is its blocks · t_block + (first: t_embed) + (last: t_head) + its sends, and the
slowest stage paces the pipeline: pipelined = (m + p − 1) · max over stages.
"""
SPLITS = ("even", "balanced", "ends")


def stage_split(n_layer, pp, split, block, embed, head):
    """Blocks per stage (a list of pp counts) under `split` (SPLITS), a block costing `block`."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")
    if split == "balanced":
        return balanced_split(n_layer, pp, block, embed, head)
    if split == "ends" and pp > 2 and n_layer >= 2 * pp - 2:
        return ends_split(n_layer, pp)
    base, extra = divmod(n_layer, pp)
    return [base + (stage < extra) for stage in range(pp)]


def balanced_split(n_layer, pp, block, embed, head):
    """The split whose slowest stage is fastest (the module docstring); of the stages' spare room
    the last ones give up blocks first."""
    ends = [embed + head] if pp == 1 else [embed] + [0.0] * (pp - 2) + [head]

    def capacities(time):
        return [int((time - extra) / block + 1e-9) for extra in ends]

    times = sorted({k * block + extra for k in range(1, n_layer + 1) for extra in set(ends)})
    low, high = 0, len(times) - 1                        # times[high] (n blocks on every stage) is enough
    while low < high:
        middle = (low + high) // 2
        fits = capacities(times[middle])
        low, high = (low, middle) if min(fits) >= 1 and sum(fits) >= n_layer else (middle + 1, high)
    split, spare = capacities(times[low]), sum(capacities(times[low])) - n_layer
    for stage in reversed(range(pp)):
        give = min(spare, split[stage] - 1)
        split[stage] -= give
        spare -= give
    return split


def ends_split(n_layer, pp):
    """The `ends` split: the first and last stage one block fewer than an even split of n_layer + 2 would
    give them (at least one fewer than the middle), the middle stages the rest, evenly."""
    ends = (n_layer + 2) // pp - 1
    base, extra = divmod(n_layer - 2 * ends, pp - 2)
    return [ends] + [base + (stage < extra) for stage in range(pp - 2)] + [ends]


def stage_seconds(split, block, embed, head, p2p):
    """Each stage's time for one micro-batch: its blocks, the ends it holds, its sends."""
    last = len(split) - 1
    return [blocks * block + (embed if stage == 0 else 0.0) + (head if stage == last else 0.0) + p2p
            for stage, blocks in enumerate(split)]
