"""The dp communication of a step under gradient compression or local SGD (parallel.data_parallel.comm_hooks,
parallel.data_parallel.local_sgd), in the cost model's α–β terms; b bytes per gradient element, n = dp:

    none        ring all-reduce of the P gradient elements                2(n−1)(α + P·b/n·β)
    powersgd:r  ring all-reduces of the uncompressed elements, of Σ m·r and of Σ k·r
                (P and Q of every compressed m × k matrix; one bucket assumed)
    topk:ρ      all-gather of k = ⌈ρ·P⌉ values (b bytes) and indices (8 bytes) per rank
    sign        all-gather of ⌈P/64⌉ int64 words of signs and one scale per tensor
    local SGD   one ring all-reduce of the P parameters every H steps: its time / H

The matrices are the rank's Linear weights and embeddings (plan.model's sharding rules);
a weight is compressed when m·k > 2·(m + k)·r, as PowerSGD(min_compression_rate=2) does (matrix_shape).
"""
import math

from minitensor.models.bert import BertConfig

from ..data_parallel.comm_hooks import make_hook
from ..tensor_parallel.sharding import padded_size
from .model import check_tp, stage_layers


def stage_matrices(config, tp, pp, stage, balance=None):
    """(m, k) of every ≥ 2-D parameter one rank of `stage` holds (Megatron's tp sharding)."""
    check_tp(config, tp)
    d, vocab = config.d_model, padded_size(config.vocab_size, tp)
    block = [(d // tp, d)] * 3 + [(d, d // tp), (4 * d // tp, d), (d, 4 * d // tp)]  # q, k, v, proj, fc, proj
    shapes = block * stage_layers(config.n_layer, pp, balance)[stage]
    bert = isinstance(config, BertConfig)
    if stage == 0:
        shapes += [(vocab // tp, d), (config.block_size, d)]  # tok_emb shard, pos_emb
        shapes += [(config.n_segments, d)] if bert else []    # BERT: seg_emb
    if stage == pp - 1 and not bert:
        shapes += [(vocab // tp, d)]  # lm_head shard
    if stage == pp - 1 and bert:      # the MLM head's dense layer; with pp > 1 the tied tok_emb's copy
        shapes += [(d, d)] + ([(vocab // tp, d)] if pp > 1 else [])
    return shapes


def dp_time(params, matrices, n, b, compress, local_steps, alpha, beta, all_reduce, all_gather):
    """(seconds per step, how) of the dp communication of one rank with `params` elements."""
    hook = make_hook(compress)
    if n == 1:
        return 0.0, "no dp communication (dp = 1)"
    if local_steps > 1:
        seconds = all_reduce(n, params * b, alpha, beta) / local_steps
        return seconds, f"local SGD (one ring all-reduce every {local_steps} steps, the time / {local_steps})"
    if hook is None:
        return all_reduce(n, params * b, alpha, beta), "ring all-reduce"
    if compress.startswith("powersgd"):
        compressed = [shape for shape in matrices if hook.matrix_shape(shape) is not None]
        r = [hook.matrix_shape(shape)[2] for shape in compressed]
        plain = params - sum(m * k for m, k in compressed)
        p_numbers = sum(m * rank for (m, _), rank in zip(compressed, r))
        q_numbers = sum(k * rank for (_, k), rank in zip(compressed, r))
        seconds = sum(all_reduce(n, count * b, alpha, beta) for count in (plain, p_numbers, q_numbers) if count)
        return seconds, (f"PowerSGD rank {hook.rank} ring all-reduces ({plain} uncompressed + {p_numbers} P + "
                         f"{q_numbers} Q numbers, not {params})")
    if compress.startswith("topk"):
        k = math.ceil(hook.ratio * params)
        return all_gather(n, n * k * (b + 8), alpha, beta), f"top-k all-gather ({k} values + int64 indices)"
    tensors = len(matrices) + 1  # + the 1-D tensors, a handful of scales: count them as one per matrix
    words = math.ceil(params / 64)
    return (all_gather(n, n * 8 * words, alpha, beta) + all_gather(n, n * b * tensors, alpha, beta),
            f"sign all-gathers ({words} int64 words of signs + scales)")
