"""Device-limited routing (DeepSeek-V2 §2.2.1; DeepSeek-V3 §2.1.2, node-limited): the E experts
lie in G equal groups (expert parallelism's ranks: rank r holds experts [r·E/G, (r+1)·E/G)),
and each token may choose experts in at most M of them, so its rows reach at most M ranks.

    group score  the sum of the ⌈k/M⌉ largest selection scores (s + b) of the group's experts
    groups       the M groups of largest group score per token (the lower index on a tie)
    experts      top-k of the scores, the experts outside the token's M groups excluded

The all-to-all then sends each token to at most M ranks (DeepSeek's fan-out cap). It is a
choice of the model, not of the layout: one device routes with the same G groups, so a run
at ep = G equals one device.
"""
import math

import numpy as np


def device_limit_problem(n_experts, k, groups, max_groups):
    """Why E experts in `groups` groups cannot hold top-k on `max_groups` of them (one line), or None."""
    if groups < 1 or n_experts % groups:
        return f"MoE: n_experts={n_experts} is not divisible into expert_groups={groups}"
    if not 1 <= max_groups <= groups:
        return (f"MoE: max_groups_per_token={max_groups} must be in [1, expert_groups={groups}] "
                f"(a token's experts on at most M of the G ranks)")
    if max_groups * (n_experts // groups) < k:  # then ⌈k/M⌉ ≤ E/G too: a group's best ⌈k/M⌉ exist
        return (f"MoE: top_k={k} experts do not fit in max_groups_per_token={max_groups} groups of "
                f"{n_experts // groups} experts")
    return None


def check_device_limit(n_experts, k, groups, max_groups):
    """A ValueError for groups and a limit that cannot work."""
    problem = device_limit_problem(n_experts, k, groups, max_groups)
    if problem:
        raise ValueError(problem)


def limit_to_groups(scores, k, groups, max_groups):
    """`scores` (N, E, numpy) with the experts outside each token's `max_groups` best groups set
    to -inf: top_k of the result picks experts on at most max_groups groups."""
    n, n_experts = scores.shape
    by_group = scores.reshape(n, groups, n_experts // groups)
    # exercise 20.5: device-limited selection
    # hint: a group's score: the sum of its ⌈k/M⌉ largest scores (np.sort along the last axis, the last columns);
    # hint: keep the M groups of largest group score (stable argsort of its negative, the lower index first)
    # hint: and set every other group's scores to -inf.
    group_score = np.sort(by_group, axis=-1)[..., -math.ceil(k / max_groups):].sum(axis=-1)
    best = np.argsort(-group_score, axis=-1, kind="stable")[:, :max_groups]
    allowed = np.zeros((n, groups), bool)
    np.put_along_axis(allowed, best, True, axis=-1)
    return np.where(allowed[:, :, None], by_group, -np.inf).reshape(n, n_experts)
    # end exercise
