"""Mixture of experts: a router sends each token to k of E expert MLPs, in place of a
block's MLP (Switch Transformer, GShard, Mixtral).

    x (B, T, C) as N = B·T tokens
      ─▶ router    logits = x·Wᵣᵀ (N, E), scores s = softmax(logits), or sigmoid(logits)
                   (`router_score`, DeepSeek-V3 eq. 15)
      ─▶ top-k     the k experts of largest s + b per token (b: the loss-free balancing bias,
                   moe_balance.py; 0 unless its rate γ > 0), on at most M of the G expert
                   groups when device-limited (moe_device_limit.py); gate g = s of each (never s + b),
                   divided by their sum when `renormalize` (Mixtral; sigmoid scores always,
                   eq. 13) or as they are (Switch). For k = 1 the gate stays s (Switch):
                   s/s = 1 would leave the router no gradient from the task loss
      ─▶ capacity  per token group (one sequence of T tokens), at most ⌈C·T·k/E⌉ assignments
                   per expert: first choices before second ones, earlier tokens first; the rest
                   are dropped (that slot adds 0: the token goes on through the residual).
                   capacity_factor None: dropless, no limit
      ─▶ experts   y[t] = Σ over t's kept assignments a of g_a · expert_{e_a}(x_t), wherever the
                   experts live: the layer's dispatcher computes it (LocalDispatcher: all here;
                   expert parallelism: on their ranks, one row per (token, rank))
                   dispatch  the kept assignments sorted by expert: x_perm = x[token[order]]
                   run       expert e on its counts[e] contiguous rows of x_perm
                   combine   each output row times its gate, added into its token's row
      ─▶ shared    + shared(x_t): `shared_experts` experts every token passes through
                   (DeepSeekMoE), held as one MLP of shared_experts × the expert width

Fine-grained experts (DeepSeekMoE): an expert's hidden width d_ff is its own setting, so
m·E experts of width d_ff/m with top-m·k keep a token's FLOPs and multiply its choices.

Two losses join the model's loss (`aux_loss`), each a mean over the token groups:

    balancing (Switch)      α · E · Σᵢ fᵢ · Pᵢ    fᵢ: share of the group's T·k assignments that
                                                  chose expert i (before capacity), Pᵢ: mean of
                                                  sᵢ / Σⱼ sⱼ (softmax: pᵢ itself)
    router z-loss (ST-MoE)  β · mean over tokens of (log Σⱼ exp logitsⱼ)²

Σᵢ fᵢ·Pᵢ is smallest (1/E) when both are uniform; the gradient flows through Pᵢ only and
pushes probability away from the experts that receive most tokens. `aux_loss_scope` picks
the balancing loss's token group:
    "sequence"  one sequence: DeepSeek-V3's sequence-wise balance loss (eqs. 17–20: its fᵢ
                is E times the share, its s'ᵢ the normalised score); no sequence may lean
                on a few experts
    "batch"     every token of the micro-batch: Switch Transformer's loss (eqs. 4–6),
                GShard's and Megatron's aux_loss; looser (DeepSeek-V3 §4.5.3): a sequence
                may keep to the experts of its domain while the batch stays balanced
A capacity stays per sequence in both (it orders a sequence's own tokens).

Where a group's tokens lie (`token_group_ranks`): data parallelism and micro-batches split the
batch by whole sequences (by rows), so a sequence's statistics are the same on one device
and in those layouts; context parallelism splits each sequence over the cp ranks, and a
micro-batch lies over the dp × cp ranks. The rank then averages its shares fᵢ over those
ranks (one all-reduce of E numbers per layer) and keeps its own Pᵢ: the ranks' mean of
α·E·Σᵢ fᵢ·Pᵢ(rank) is the whole group's loss, since P is a mean over equal shares of tokens.
A capacity under cp, which keeps a sequence's earliest tokens first, is refused (those
tokens lie on other ranks).
"""
import math
from collections import namedtuple

import numpy as np

from minitensor.nn import functional as F
from minitensor.nn.layers import Dropout, Linear
from minitensor.nn.module import Module, ModuleList
from minitensor.nn.moe_balance import ExpertBias
from minitensor.nn.moe_device_limit import check_device_limit, limit_to_groups
from minitensor.nn.moe_ops import gather_rows, scatter_add_rows
from minitensor.shape_ops import concat
from minitensor.tensor import DEFAULT_FLOAT

# per assignment (N·k, token-major): its token (row), expert, gate weight (a Tensor) and whether it is kept
Routing = namedtuple("Routing", ["token", "expert", "weight", "kept"])


SCORES = {"softmax": lambda logits: F.softmax(logits, axis=-1), "sigmoid": F.sigmoid}


def top_k(probs, k):
    """(N, k) experts of the k largest probabilities of each row of `probs` (numpy, (N, E)),
    largest first; of equal ones the lower index."""
    # exercise 20.1: the router's top-k and balancing loss
    # hint: order each row's experts by falling probability, so that equal ones keep their index order
    # hint: (which of numpy's sorts promises that?), and keep the first k.
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    # end exercise


def balancing_loss(probs, experts, groups, coef, split=None):
    """α·E·(mean over groups of Σᵢ fᵢ·Pᵢ): probs the router's (N, E) Tensor, experts the
    (N, k) top-k choices, the N tokens in `groups` equal groups. `split`: the ranks that hold
    equal shares of each token group's tokens (the cp group for a sequence, dp × cp for a
    micro-batch), or None. f is then the ranks' mean of their shares, the whole group's f,
    while P stays this rank's: the ranks' mean of this loss is the whole group's Σᵢ fᵢ·Pᵢ."""
    n, k = experts.shape
    n_experts, per_group = probs.shape[-1], n // groups
    # exercise 20.1: the router's top-k and balancing loss
    # hint: f (groups, E): each assignment adds 1/(per_group·k) at (its token's group, its expert) (np.add.at),
    # hint: averaged over the split's ranks if there is one (all_reduce, / size);
    # hint: P (groups, E): probs averaged over each group's tokens; then α·E·Σ f·P / groups.
    f = np.zeros((groups, n_experts), probs.dtype)
    np.add.at(f, (np.arange(n)[:, None] // per_group, experts), 1 / (per_group * k))
    if split is not None:
        f = split.all_reduce(f) / split.size
    mean_probs = probs.reshape(groups, per_group, n_experts).mean(axis=1)
    return (mean_probs * f).sum() * (coef * n_experts / groups)
    # end exercise


def z_loss(logits, coef):
    """β · mean over tokens of logsumexp(logits)²: keeps the router's logits small."""
    lse = (logits - F.log_softmax(logits, axis=-1)).mean(axis=-1)  # every column is the same logsumexp
    return (lse * lse).mean() * coef


def capacity(tokens, k, n_experts, factor):
    """Assignments one expert takes from a group of `tokens` tokens: ⌈C·tokens·k/E⌉, at most
    `tokens` (an expert takes a token once, so from C·k ≥ E on nothing is dropped, and a
    C of 1e308 must not overflow the product)."""
    return tokens if factor * k >= n_experts else math.ceil(factor * tokens * k / n_experts)


def within_capacity(experts, group_size, cap):
    """Bool (N·k,): which assignments (token-major, as experts.reshape(-1)) fit. Within a group
    and an expert, first choices come before second ones, and earlier tokens first."""
    n, k = experts.shape
    expert, token, choice = experts.reshape(-1), np.repeat(np.arange(n), k), np.tile(np.arange(k), n)
    order = np.lexsort((token, choice, expert, token // group_size))  # the last key is the primary one
    key = (token // group_size * (expert.max() + 1) + expert)[order]  # sorted: (group, expert) runs
    place = np.arange(order.size) - np.searchsorted(key, key)  # place in its (group, expert) run
    kept = np.empty(order.size, bool)
    kept[order] = place < cap
    return kept


def dispatch_order(expert, kept, n_experts):
    """(order, counts): the kept assignments sorted by expert (in token order within one),
    and how many each expert gets. x[token[order]] puts each expert's tokens side by side."""
    # exercise 20.2: the dispatch permutation and its inverse
    # hint: only the kept assignments, ordered by their expert, an expert's own in token order (the sort
    # hint: must not reorder ties); counts: how many each expert gets, every expert, even one with none.
    chosen = np.flatnonzero(kept)
    order = chosen[np.argsort(expert[chosen], kind="stable")]
    return order, np.bincount(expert[order], minlength=n_experts)
    # end exercise


def combine(y_perm, routing, order, n_tokens):
    """The inverse of dispatch: row j of y_perm (assignment order[j]), times its gate weight,
    added into its token's row; an (n_tokens, C) Tensor (dropped slots add nothing)."""
    # exercise 20.2: the dispatch permutation and its inverse
    # hint: gather the weights of the ordered assignments (gather_rows), scale y_perm's rows by them,
    # hint: and scatter_add_rows them into their tokens (routing.token[order]).
    weight = gather_rows(routing.weight, order).reshape(-1, 1)
    return scatter_add_rows(y_perm * weight, routing.token[order], n_tokens)
    # end exercise


def run_each_expert(experts, x_perm, counts):
    """Expert i of `experts` on its counts[i] contiguous rows of x_perm; the outputs in the same order."""
    ends = np.cumsum(counts)
    return concat([expert(x_perm[end - n:end]) for expert, n, end in zip(experts, counts, ends, strict=True)])


def mix_experts(x, routing, experts):
    """(rows of x, C): row t the sum over its kept assignments a of g_a · experts[e_a](x_t), the
    `experts` indexed as routing.expert counts them. Dispatch, run, combine (the module docstring)."""
    order, counts = dispatch_order(routing.expert, routing.kept, len(experts))
    y_perm = run_each_expert(experts, gather_rows(x, routing.token[order]), counts)
    return combine(y_perm, routing, order, x.shape[0])


class LocalDispatcher:
    """How tokens reach the experts when all of them are on this device: mix_experts here.

    A dispatcher is a part of the MoE layer with one method, run_experts(x, routing, experts):
    x the (N, C) tokens, `routing` their Routing, `experts` the layer's; it returns the (N, C)
    gate-weighted sum of each token's kept experts (mix_experts' answer). Expert parallelism's
    dispatcher (parallel.expert_parallel) computes it on the ranks that hold the experts. It
    holds no parameters, so it is no Module: the layer's parameter names do not see it."""

    def run_experts(self, x, routing, experts):
        return mix_experts(x, routing, experts)


class Expert(Module):
    """One expert: the GPT's MLP, fc → GELU → proj. routed: its rows are the tokens routed to it, grouped
    and ordered as the layout delivers them (its linears say so: an FP8 recipe then keeps its tiles
    inside a token's row and agrees its amaxes over the expert's replicas, minitensor.fp8.linear)."""

    def __init__(self, d_model, d_ff, dtype=DEFAULT_FLOAT, routed=False):
        super().__init__()
        self.fc = Linear(d_model, d_ff, dtype=dtype)
        self.proj = Linear(d_ff, d_model, dtype=dtype)
        self.fc.routed = self.proj.routed = routed

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class MoE(Module):
    """E experts of hidden width d_ff and a router (see the module docstring); `dispatcher` runs the
    experts wherever they live (default: LocalDispatcher, every expert here);
    `shared_experts` experts every token runs; `router_score` "softmax" or "sigmoid";
    `expert_bias_rate` γ of loss-free balancing (0: no bias); `expert_groups` G and
    `max_groups_per_token` M: device-limited routing (moe_device_limit.py; default M = G, no
    limit); `aux_loss_scope` "sequence" or "batch": the balancing loss's token group. After
    each forward: `aux_loss` (the balancing + z losses, a scalar Tensor), `load` (tokens each expert ran on),
    `dropped` (assignments over capacity) and `chosen` (N, k): each token's experts."""

    def __init__(self, d_model, d_ff, n_experts, top_k=2, renormalize=True, capacity_factor=None,
                 aux_loss_coef=0.01, z_loss_coef=0.0, dropout=0.0, dtype=DEFAULT_FLOAT, dispatcher=None,
                 shared_experts=0, router_score="softmax", expert_bias_rate=0.0, expert_groups=1,
                 max_groups_per_token=None, aux_loss_scope="sequence"):
        super().__init__()
        check_routing(n_experts, top_k, renormalize, router_score, aux_loss_scope)
        self.groups, self.max_groups = expert_groups, max_groups_per_token or expert_groups
        check_device_limit(n_experts, top_k, self.groups, self.max_groups)
        self.n_experts, self.top_k, self.router_score = n_experts, top_k, router_score
        self.normalize = router_score == "sigmoid" or (renormalize and top_k > 1)
        self.capacity_factor, self.aux_loss_coef, self.z_loss_coef = capacity_factor, aux_loss_coef, z_loss_coef
        self.aux_loss_scope = aux_loss_scope
        self.router = Linear(d_model, n_experts, bias=False, dtype=dtype)
        self.experts = ModuleList(Expert(d_model, d_ff, dtype, routed=True) for _ in range(n_experts))
        self.shared = Expert(d_model, shared_experts * d_ff, dtype) if shared_experts else None
        self.drop = Dropout(dropout)
        self.dispatcher = LocalDispatcher() if dispatcher is None else dispatcher
        self.bias = ExpertBias(n_experts, expert_bias_rate)
        self.token_group_ranks = None  # the ranks holding the rest of a balancing-loss group's tokens
        self.aux_loss = self.load = self.dropped = self.chosen = None

    def set_token_group_ranks(self, sequence_ranks, batch_ranks):
        """Where the rest of a balancing-loss token group lies: `sequence_ranks` hold the rest of
        each sequence (context parallelism's cp group, or None), `batch_ranks` the rest of the
        micro-batch (dp × cp, or None on one rank). The loss averages its shares f over the
        ranks of its scope (balancing_loss)."""
        self.token_group_ranks = batch_ranks if self.aux_loss_scope == "batch" else sequence_ranks

    def forward(self, x):
        b, t, c = x.shape
        flat = x.reshape(b * t, c)
        y = self.dispatcher.run_experts(flat, self.route(flat, groups=b), self.experts)
        y = y if self.shared is None else y + self.shared(flat)
        return self.drop(y.reshape(b, t, c))

    def step_updates(self, replicas=None):
        """The loss-free balancing bias, which moves after each optimizer step by the loads
        summed over `replicas` (the ranks routing the other tokens; None on one device)."""
        self.bias.replicas = replicas
        return [self.bias]

    def route(self, flat, groups):
        """The Routing of the (N, C) tokens `flat`, in `groups` equal token groups; sets aux_loss."""
        n, k = flat.shape[0], self.top_k
        logits = self.router(flat)
        scores = SCORES[self.router_score](logits)
        # exercise 20.4: the bias picks the experts, the gate ignores it
        # hint: top_k of the scores' values plus self.bias.value, limited to the token's groups (limit_to_groups);
        # hint: count them (self.bias.count); the weights: the chosen experts' scores themselves (gather_rows
        # hint: of the flat scores Tensor).
        experts = top_k(limit_to_groups(scores.data + self.bias.value, k, self.groups, self.max_groups), k)
        self.bias.count(experts)
        weight = gather_rows(scores.reshape(-1), (np.arange(n)[:, None] * self.n_experts + experts).reshape(-1))
        # end exercise
        if self.normalize:
            weight = weight.reshape(n, k)
            weight = (weight / weight.sum(axis=-1, keepdims=True)).reshape(-1)
        kept = np.ones(n * k, bool)
        if self.capacity_factor is not None:
            kept = within_capacity(experts, n // groups, capacity(n // groups, k, self.n_experts, self.capacity_factor))
        affinity = scores if self.router_score == "softmax" else scores / scores.sum(axis=-1, keepdims=True)
        loss_groups = groups if self.aux_loss_scope == "sequence" else 1
        self.aux_loss = (balancing_loss(affinity, experts, loss_groups, self.aux_loss_coef, self.token_group_ranks)
                         + z_loss(logits, self.z_loss_coef))
        self.load = np.bincount(experts.reshape(-1)[kept], minlength=self.n_experts)
        self.dropped, self.chosen = int(n * k - kept.sum()), experts
        return Routing(np.repeat(np.arange(n), k), experts.reshape(-1), weight, kept)


AUX_LOSS_SCOPES = ("sequence", "batch")


def check_routing(n_experts, k, renormalize, router_score, aux_loss_scope="sequence"):
    """One-line errors for routing settings that cannot work."""
    if aux_loss_scope not in AUX_LOSS_SCOPES:
        raise ValueError(f"MoE: aux_loss_scope={aux_loss_scope!r} is not one of {AUX_LOSS_SCOPES}")
    if not 1 <= k <= n_experts:
        raise ValueError(f"MoE: top_k={k} must be in [1, n_experts={n_experts}]")
    if router_score not in SCORES:
        raise ValueError(f"MoE: router_score={router_score!r} is not one of {sorted(SCORES)}")
    if router_score == "sigmoid" and (k == 1 or not renormalize):
        raise ValueError(f"MoE: router_score='sigmoid' normalises the gates over the chosen experts (top_k={k}, "
                         f"renormalize={renormalize}): it needs top_k ≥ 2 and renormalize, or use softmax")
