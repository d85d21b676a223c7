"""The planner's arithmetic of a mixture-of-experts GPT (minitensor.nn.moe, parallel.expert_parallel):
parameters, FLOPs per token (a token runs only its k experts), expert memory per rank under ep,
and the all-to-all traffic and its α–β time. Ranking layouts with ep (search.py) is left for
later: these are the numbers it will need.

    expert        fc (d·f + f) + proj (f·d + d), f = config.mlp_width
    MoE layer     the router d·E and E experts, in place of one MLP
    total         dense_param_count + Σ over MoE layers (d·E + E·expert − MLP)
    active        total − Σ over MoE layers (E − k)·expert: what one token's forward touches
    FLOPs/token   6 · the matmul weights a token multiplies (forward 2, backward 4 per weight):
                  the dense ones, with each MoE layer's MLP replaced by its router and k experts
    all-to-all    per MoE layer and micro-batch, what a rank sends: dispatch forward and combine
                  backward carry the rows it sends the other ep − 1 ranks, combine forward and
                  dispatch backward the rows it received from them: 2·(sent + received)·d values;
                  plus, in forward, the counts: E − E/ep int64. Dropless and balanced, a rank of
                  t tokens sends and receives t·k·(ep − 1)/ep rows
"""
import math

from .model import dense_param_count, matmul_weight_count

COUNT_BYTES = 8  # the per-expert row counts travel as int64


def moe_layers(config):
    """How many blocks have a mixture-of-experts MLP."""
    return sum(config.is_moe(layer) for layer in range(config.n_layer))


def expert_param_count(config):
    d, f = config.d_model, config.mlp_width
    return 2 * d * f + f + d


def moe_param_count(config):
    """All parameters of the single-device MoE GPT (the dense count when n_experts = 0)."""
    d, dense_mlp = config.d_model, 8 * config.d_model ** 2 + 5 * config.d_model  # plan.model's MLP: f = 4d
    per_layer = d * config.n_experts + config.n_experts * expert_param_count(config) - dense_mlp
    return dense_param_count(config) + moe_layers(config) * per_layer


def active_param_count(config):
    """Parameters one token's forward uses: only k experts of each MoE layer."""
    return moe_param_count(config) - moe_layers(config) * (config.n_experts - config.top_k) * expert_param_count(config)


def flops_per_token(config):
    """Training FLOPs of one token, 6 per matmul weight it multiplies (attention scores left out)."""
    d, f = config.d_model, config.mlp_width
    per_moe_layer = d * config.n_experts + config.top_k * 2 * d * f - 8 * d * d
    return 6 * (matmul_weight_count(config) + moe_layers(config) * per_moe_layer)


def expert_bytes_per_rank(config, ep, bytes_per_param=16):
    """Bytes of this rank's E/ep experts in every MoE layer (16 per parameter: float32 weight,
    gradient and AdamW's two moments)."""
    return moe_layers(config) * config.n_experts // ep * expert_param_count(config) * bytes_per_param


def all_to_all_bytes(sent, received, d_model, itemsize, n_experts, ep):
    """Bytes one rank's ep group counts for one MoE layer and micro-batch, given the rows it
    sent to and received from the other ranks (after capacity): 4 row exchanges and the counts."""
    if ep == 1:
        return 0
    return 2 * (sent + received) * d_model * itemsize + (n_experts - n_experts // ep) * COUNT_BYTES


def balanced_all_to_all_bytes(config, tokens, ep, itemsize=4):
    """all_to_all_bytes per step for `tokens` tokens per rank, dropless and perfectly balanced."""
    rows = math.ceil(tokens * config.top_k * (ep - 1) / ep)
    return moe_layers(config) * all_to_all_bytes(rows, rows, config.d_model, itemsize, config.n_experts, ep)


def all_to_all_seconds(ep, nbytes, alpha, beta):
    """α–β time of the step's all-to-all bytes: each of the 5 exchanges per layer is ep − 1 messages."""
    return 5 * (ep - 1) * alpha + nbytes * beta if ep > 1 else 0.0
