"""Compute of one stage in flops (the formulas are cost.py's module docstring), and the seconds an
FP8 recipe saves by running the blocks' linears at the float8 peak: attention's q, k, v, proj and
the MLP's fc, proj, or in an MoE block each token's k routed and S shared experts (DeepSeek-V3
§3.3: the experts' linears in FP8), but never the router, QKᵀ and AV or the head."""
from dataclasses import replace

from .model import moe_blocks
from .profiles import peak_flops


def linear_flops(config, moe, tokens, tp):
    """Flops of one pass of a block's linears that run in FP8 under a recipe, `tokens` tokens on one tp rank:
    attention's q, k, v, proj and the MLP over tp, or an MoE block's k routed and S shared experts whole."""
    h, attention = config.d_model, 2 * 4 * config.d_model**2 * tokens / tp
    if not moe:
        return attention + 2 * 8 * h * h * tokens / tp
    return attention + 2 * (config.top_k + config.shared_experts) * 2 * h * config.expert_width * tokens


def block_flops(config, moe, tokens, tp, passes):
    """Flops of a dense block, or an MoE block if `moe`, for `tokens` tokens on one tp rank, over `passes` passes:
    its linears, QKᵀ and AV, and an MoE block's router (whole on every tp rank, in higher precision)."""
    scores, router = 4 * config.block_size * config.d_model * tokens / tp, 2 * config.d_model * config.n_experts * tokens
    return passes * (linear_flops(config, moe, tokens, tp) + scores + (router if moe else 0))


def over_blocks(config, blocks, flops):
    """flops(moe) summed over the blocks (global indices): the dense ones' and the MoE ones'."""
    moe = moe_blocks(config, blocks)
    return (len(blocks) - moe) * flops(False) + (moe * flops(True) if moe else 0)


def fp8_seconds(profile, precision, config, blocks, tokens, tp, recompute, rate):
    """Seconds an FP8 recipe saves on a stage holding `blocks`: their linears at the float8 peak, not `rate`."""
    if not precision.fp8_flops_keys:
        return 0.0
    _, fp8_peak = peak_flops(profile, replace(precision, flops_keys=precision.fp8_flops_keys))
    linears = (4 if recompute else 3) * over_blocks(config, blocks, lambda moe: linear_flops(config, moe, tokens, tp))
    return linears / rate - linears / (fp8_peak * profile["efficiency"])


def stage_flops(config, layers, tokens, tp, recompute, last, first_block=0):
    """Training flops of one micro-batch on one tp rank of a stage holding blocks
    first_block .. first_block + layers - 1 (see module doc)."""
    passes = 4 if recompute else 3        # forward = 1 pass, backward = 2 passes
    blocks = over_blocks(config, range(first_block, first_block + layers),
                         lambda moe: block_flops(config, moe, tokens, tp, passes))
    head = 6 * config.vocab_size * config.d_model * tokens / tp if last else 0
    return blocks + head
