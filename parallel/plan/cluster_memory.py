"""The activations a GPU-cluster layout (plan.cluster) holds on its largest stage."""
from .dual import DUAL, held_stages, in_flight_stages
from .memory import block_activation_bytes

DTYPE = "mixed"                     # --fp16: 2-byte weights, grads (reduced in fp16), fp32 master + Adam: 16 B/param


def activation_bytes(config, b, tp, pp, v, m, recompute="full", sequence_parallel=False, blocks=None, schedule="1f1b"):
    """The largest stage's activations (Korthikanti et al. 2022's per-block bytes, memory.py): 1F1B's
    stage r keeps min(m, p − r) micro-batches of its blocks (blocks[r]; default n_layer/p); interleaving min(m·v, 2(p−1) + (v−1)p + 1) chunk-micro-batches of
    n_layer/(p·v) (Megatron's warm-up). Full recomputation keeps each block's input and holds one block's
    whole activations while it reruns; selective keeps all but the 5·a·s²·b attention-score bytes, and
    holds one block's scores while it reruns its core attention. DualPipe(V): plan.dual's count, blocks
    then listing every stage's (2·pp in the V)."""
    s, full = config.block_size, recompute == "full"
    scores = 5 * config.n_head * s * s * b / tp
    kept = block_activation_bytes(config, b, tp, sequence_parallel, full, DTYPE) - (0 if full else scores)
    blocks = blocks or [config.n_layer // pp] * pp
    if schedule in DUAL:  # plan.dual: the stage-micro-batches a rank holds, of its larger stage
        held = max(in_flight_stages(schedule, m, pp, rank) * max(blocks[i] for i, _ in held_stages(schedule, pp, rank))
                   for rank in range(pp))
    elif v == 1:
        held = max(count * min(m, pp - stage) for stage, count in enumerate(blocks))
    else:
        held = config.n_layer // (pp * v) * min(m * v, 2 * (pp - 1) + (v - 1) * pp + 1)
    working = block_activation_bytes(config, b, tp, sequence_parallel, False, DTYPE) if full else scores
    return kept * held + working
