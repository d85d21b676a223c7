"""The planner's arithmetic of a mixture-of-experts GPT (minitensor.nn.moe, parallel.expert_parallel):
parameters, FLOPs per token (a token runs only its k experts), expert memory per rank under ep,
and the all-to-all traffic and its α–β time. The layout search (search.py, cost.py) ranks
layouts with ep from these and model.py's per-rank counts (moe_block_param_count).

    expert        fc (d·f + f) + proj (f·d + d), f = config.expert_width (fine-grained experts)
    MoE layer     the router d·E, the shared experts (one MLP of S·f) and E experts, in place of
                  one MLP
    total         model.dense_param_count: all parameters of the single-device model, each MoE
                  block with d·E + E·expert in place of its MLP (model.moe_block_param_count)
    active        total − Σ over MoE layers (E − k)·expert: what one token's forward touches
    FLOPs/token   6 · the matmul weights a token multiplies (forward 2, backward 4 per weight):
                  the dense ones, with each MoE layer's MLP replaced by its router, k experts
                  and the S shared ones
    all-to-all    per MoE layer and micro-batch, what a rank sends: the dispatcher sends one row
                  per (token, rank) (parallel.expert_parallel.dispatch), the token's d values and
                  its gates for the rank's E/ep experts. Dispatch forward and combine backward
                  carry the rows it sends the other ep − 1 ranks (d + E/ep and d wide), combine
                  forward and dispatch backward the rows it received from them:
                  (sent + received)·(2d + E/ep) values; plus, in forward, the counts: ep − 1 int64
                  (a rank's rows to itself never leave it, and count nothing)
    fan-out       rows per token: the distinct ranks among its k experts. Choosing k of E
                  uniformly, a rank holds none of them with probability C(E − E/ep, k)/C(E, k), so
                  E[ranks] = ep·(1 − C(E − E/ep, k)/C(E, k)), at most min(k, ep); device-limited
                  routing caps it at M (the assumption: routing as even as the limit lets it).
                  The token's own rank is one of them as likely as any: (ep − 1)/ep of them leave
    balancing     per MoE layer and micro-batch (forward; again under recomputation), the
                  balancing loss's shares f all-reduced over the ranks that hold its token
                  group's tokens (minitensor.nn.moe, `aux_loss_scope`): b·E values over cp for
                  the rank's b sequences, or E over dp·cp for the micro-batch
"""
import math

from minitensor.nn.moe_device_limit import device_limit_problem

from ..alpha_beta import all_to_all, ring_all_reduce
from ..expert_parallel.composes import expert_composition_problem, moe_block_problem
from .model import dense_param_count, expert_param_count, expert_params_on_stage, has_experts, matmul_weight_count

COUNT_BYTES = 8  # the per-expert row counts travel as int64


def expert_fields(args, n_layer):
    """The GPTConfig fields the planner's --experts, --top-k, --moe-every, --expert-hidden,
    --shared-experts give (none without --experts); a ValueError for what the trainer refuses
    too (expert_parallel.composes)."""
    if not args.experts:
        given = [flag for flag, value in (("top-k", args.top_k), ("moe-every", args.moe_every),
                                          ("expert-hidden", args.expert_hidden), ("shared-experts", args.shared_experts),
                                          ("aux-loss-scope", args.aux_loss_scope != "sequence"),
                                          ("max-ranks-per-token", args.max_ranks_per_token)) if value]
        if given:
            raise ValueError(f"--{given[0]} needs --experts E (a mixture of experts)")
        return {}
    fields = dict(n_experts=args.experts, top_k=args.top_k or min(2, args.experts), moe_every=args.moe_every or 1,
                  expert_hidden=args.expert_hidden, shared_experts=args.shared_experts,
                  aux_loss_scope=args.aux_loss_scope)
    if fields["top_k"] > args.experts:
        raise ValueError(f"--top-k {fields['top_k']} exceeds --experts {args.experts}: a token cannot choose more "
                         f"experts than there are")
    problem = moe_block_problem(n_layer, fields["moe_every"]) or expert_composition_problem(
        args.experts, precision=args.dtype, local_steps=args.local_steps if args.local_steps > 1 else None,
        compress=args.compress, model=args.model)
    if problem:
        raise ValueError(problem)
    return fields


def moe_layers(config):
    """How many blocks have a mixture-of-experts MLP."""
    return sum(config.is_moe(layer) for layer in range(config.n_layer))


def active_param_count(config):
    """Parameters one token's forward uses: only k experts of each MoE layer."""
    return dense_param_count(config) - moe_layers(config) * (config.n_experts - config.top_k) * expert_param_count(config)


def flops_per_token(config):
    """Training FLOPs of one token, 6 per matmul weight it multiplies (attention scores left out)."""
    d, f = config.d_model, config.expert_width
    per_moe_layer = d * config.n_experts + (config.top_k + config.shared_experts) * 2 * d * f - 8 * d * d
    return 6 * (matmul_weight_count(config) + moe_layers(config) * per_moe_layer)


def expert_bytes_per_rank(config, ep, bytes_per_param=16):
    """Bytes of this rank's E/ep experts in every MoE layer (16 per parameter: float32 weight,
    gradient and AdamW's two moments)."""
    return expert_params_on_stage(config, ep=ep) * bytes_per_param


def all_to_all_bytes(sent, received, d_model, itemsize, n_experts, ep):
    """Bytes one rank's ep group counts for one MoE layer and micro-batch, given the rows it
    sent to and received from the other ranks (one per (token, rank), after capacity): 4 row
    exchanges and the counts."""
    if ep == 1:
        return 0
    return (sent + received) * (2 * d_model + n_experts // ep) * itemsize + (ep - 1) * COUNT_BYTES


def ranks_per_token(config, ep, max_ranks=None):
    """Expected distinct ep ranks a token's rows reach (the module docstring's fan-out): uniform
    routing, capped by the device limit `max_ranks` M (None: no limit)."""
    n_experts, k = config.n_experts, config.top_k
    uniform = ep * (1 - math.comb(n_experts - n_experts // ep, k) / math.comb(n_experts, k))
    return min(uniform, max_ranks or ep)


def rows_sent(config, tokens, ep, max_ranks=None):
    """Rows a rank of `tokens` tokens sends the other ranks (and receives), dropless and balanced."""
    return math.ceil(tokens * ranks_per_token(config, ep, max_ranks) * (ep - 1) / ep)


def device_limit_fits(config, ep, max_ranks):
    """Whether top-k fits on `max_ranks` of ep ranks of E/ep experts (the model's own rule, moe_device_limit)."""
    return max_ranks is None or device_limit_problem(config.n_experts, config.top_k, ep, max_ranks) is None


def balanced_all_to_all_bytes(config, tokens, ep, itemsize=4, max_ranks=None):
    """all_to_all_bytes per step for `tokens` tokens per rank, dropless and balanced."""
    rows = rows_sent(config, tokens, ep, max_ranks)
    return moe_layers(config) * all_to_all_bytes(rows, rows, config.d_model, itemsize, config.n_experts, ep)


def all_to_all_seconds(config, tokens, ep, itemsize, alpha, beta, recompute=False, max_ranks=None):
    """α–β seconds of one MoE layer's all-to-alls for one micro-batch of `tokens` tokens per
    rank, dropless and balanced: forward the counts and two row exchanges (dispatch, d + E/ep
    values a row; combine, d), backward two more; recomputation repeats the forward's. Each
    exchange is pairwise: (ep − 1)·α + the bytes sent·β (alpha_beta.all_to_all, what --link charges)."""
    if ep == 1:
        return 0.0
    rows = rows_sent(config, tokens, ep, max_ranks)
    exchanges = sum(all_to_all(ep, rows * width * itemsize, alpha, beta)
                    for width in (config.d_model + config.n_experts // ep, config.d_model))
    counts = all_to_all(ep, (ep - 1) * COUNT_BYTES, alpha, beta)
    return (2 if recompute else 1) * (counts + exchanges) + exchanges


def balancing_ranks(config, dp, cp):
    """The ranks an MoE layer all-reduces its balancing loss's shares over: those holding the rest
    of a token group, a sequence's cp ranks or a micro-batch's dp·cp (1: none, or no experts)."""
    if not has_experts(config):
        return 1
    return dp * cp if config.aux_loss_scope == "batch" else cp


def balancing_seconds(config, sequences, ranks, itemsize, alpha, beta, recompute=False):
    """α–β seconds of one MoE layer's balancing all-reduce per micro-batch: E shares per token group
    (each of the rank's `sequences`, or its one micro-batch) over `ranks` ranks, in the forward."""
    if ranks == 1:
        return 0.0
    groups = 1 if config.aux_loss_scope == "batch" else sequences
    return (2 if recompute else 1) * ring_all_reduce(ranks, groups * config.n_experts * itemsize, alpha, beta)


def moe_layer_seconds(config, layout, sequences, itemsize, link):
    """(seconds, --explain lines) of one MoE layer's communication per micro-batch of `sequences`
    sequences per rank: the all-to-alls over ep (consecutive dp ranks, stride tp·cp) and the
    balancing all-reduce (stride tp); link(stride, size) gives the group's (kind, α, β)."""
    tokens = sequences * config.block_size // layout.cp
    ep_kind, alpha, beta = link(layout.tp * layout.cp, layout.ep)
    exchange = all_to_all_seconds(config, tokens, layout.ep, itemsize, alpha, beta, layout.recompute,
                                  layout.max_ranks)
    ranks = balancing_ranks(config, layout.dp, layout.cp)
    kind, alpha, beta = link(layout.tp, ranks)
    balance = balancing_seconds(config, sequences, ranks, itemsize, alpha, beta, layout.recompute)
    lines = [f"ep all-to-alls ({ep_kind}): {exchange:.3g} s per MoE block and micro-batch"] if exchange else []
    if balance:
        lines.append(f"balancing all-reduce over {ranks} ranks ({kind}): {balance:.3g} s per MoE block and micro-batch")
    return exchange + balance, lines
