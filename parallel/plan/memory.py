"""Bytes one rank holds: parameters, gradients, optimizer states, activations.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models"), per block and micro-batch, at 2 bytes per element:
    no tensor parallel:        s·b·h·(34 + 5·a·s/h)
    tp = t:                    s·b·h·(10 + 24/t + 5·a·s/(h·t))   (LayerNorm and residual
                                                                  parts stay replicated)
    tp = t, sequence parallel: s·b·h·(34 + 5·a·s/h) / t
    full recomputation:        2·s·b·h (only the block input; / t with sequence parallel),
                               plus one block's full activations while it is recomputed.
The 34 counts 1-byte dropout masks the model here does not have, so the figure is a
slight over-estimate. Other dtypes scale the formula by bytes/2. The last stage's
logits are not counted. A mixture-of-experts block is counted as a dense one: an
under-estimate, since each token's k expert MLPs and the dispatched copies keep more.

Context parallelism (cp ranks, ring attention) gives each rank s/cp of the tokens, so every
per-token term divides by cp. The attention probabilities (the 5·a·s/h term) are not kept
at all: ring attention recomputes them in backward from the log-sum-exp, and keeps its
q, k, v and output instead (8/t at 2 bytes per element). What does NOT divide by cp: the
parameters and their gradients (replicated on every cp rank, as on every dp rank); the
optimizer states unless ZeRO-1 shards them, over dp·cp ranks. (This is the ring's figure;
Ulysses keeps the probabilities of its H/cp heads over all s tokens: the cp = 1 figure / cp.)

Flash attention (Layout.attention = "flash", minitensor/nn/flash_attention.py) keeps no
probabilities at any cp: the 5·a·s/h term becomes the ring's 8 (q, k, v, output). Its L, a·s·b
numbers per block, is a/h of one s·b·h activation and left out, as the ring's is.
"""
from .dual import DUAL, held_stages, in_flight_stages, stage_count
from .layout import get_precision
from .model import routing_bias_bytes, stage_blocks, unit_replica_counts


def _coords(rank_coords):
    if isinstance(rank_coords, dict):
        return rank_coords.get("dp", 0), rank_coords.get("tp", 0), rank_coords.get("pp", 0)
    dp_rank, tp_rank, pp_rank = tuple(rank_coords)[:3]  # Mesh.coords also holds cp_rank, which changes no parameter
    return dp_rank, tp_rank, pp_rank


def rank_units(config, tp, pp, rank, balance=None, ep=1, schedule="1f1b"):
    """unit_replica_counts of every stage pipeline rank `rank` holds under `schedule` (plan.dual: DualPipe's
    two copies, the V's two stages of 2·pp; `balance` then lists the blocks of each of those stages)."""
    return [unit for stage, _ in held_stages(schedule, pp, rank)
            for unit in unit_replica_counts(config, tp, stage_count(schedule, pp), stage, balance, ep)]


def param_bytes_per_rank(config, dp, tp, pp, rank_coords=(0, 0, 0), dtype="float32",
                         zero=0, balance=None, cp=1, ep=1, schedule="1f1b"):
    """{"params", "grads", "optim"} bytes on the rank at (dp_rank, tp_rank, pp_rank).

    `rank_coords` is a (dp_rank, tp_rank, pp_rank) tuple (e.g. `Mesh.coords`, or
    `rank_coords(layout, rank)` for a global rank) or a dict with keys dp, tp, pp.
    `zero` is the ZeRO stage (Rajbhandari et al. 2020; K = AdamW's states, P elements), over
    the R = dp·cp replicas (cp ranks hold the same parameters as dp ranks):
        0  P·param + P·grad + P·optim bytes
        1  P·param + P·grad + ceil(P/R)·optim      (one flat vector, R equal chunks)
        2  P·param + P/R·grad + P/R·optim          (P/R = Σ over units of ceil(P_unit/R):
        3  P/R·param + P/R·grad + P/R·optim         each unit is cut into R equal chunks)
    These are the bytes held between steps (after the synced backward), and all of them: a
    walk of every numpy array reachable from a HybridGPT and its optimizer finds exactly these
    (tests/parallel/hybrid/test_memory_held.py). The flat buffers the gradients travel in
    (stage 0's buckets, ZeRO-1's flat vector and averaged chunk, ZeRO-2/3's reduce-scatter
    buffers) live only during their collective, and ZeRO-3's all-gathered units only while
    used: none is in these static figures.
    `dtype` may be a precision policy (minitensor.amp: "fp16", "bf16", or a PrecisionPolicy);
    its float32 master weights count as optimizer state: P·master, whole on every rank under
    ZeRO-0/1, P/R·master under ZeRO-2/3, whose buckets keep the masters' chunks. Under
    ZeRO-2/3 the kept gradient is the reduced chunk, in the reduction's dtype (the float32
    master gradient: the 16-bit full gradients live only until their reduce-scatter), so a
    mixed policy holds per parameter 2 + (4 + 12)/R bytes under ZeRO-2 and (2 + 4 + 12)/R
    under ZeRO-3, beside the paper's 2 + 2 + 12 with 16-bit gradient chunks.
    A mixture of experts (ep: expert parallelism) holds E/ep experts per MoE block (model.py);
    under ep > 1 ZeRO cuts them over their own replicas, the (dp/ep)·cp ranks of the edp group
    (ZeRO-1: one flat vector of them; ZeRO-2/3: a chunk per unit beside the unit's dense one),
    and its routing bias, E float32 per MoE block (loss-free balancing), counts as optimizer state.
    Under DualPipe a rank holds two stages' copies (2× parameters), under DualPipeV two stages of 2·pp
    (rank 0 the embedding and the head): `schedule` (rank_units).
    """
    dp_rank, tp_rank, pp_rank = _coords(rank_coords)
    for name, index, size in (("dp", dp_rank, dp), ("tp", tp_rank, tp), ("pp", pp_rank, pp)):
        if not 0 <= index < size:
            raise ValueError(f"{name}_rank={index} out of range for {name}={size}")
    precision = get_precision(dtype)
    replicas = dp * cp
    edp = dp // ep * cp  # the ranks holding an expert's replicas
    units = rank_units(config, tp, pp, pp_rank, balance, ep, schedule)
    count = sum(dense + experts for dense, experts in units)
    sharded = sum(-(-dense // replicas) + -(-experts // edp) for dense, experts in units)
    experts = sum(experts for _, experts in units)
    optim_count = {0: count, 1: -(-(count - experts) // replicas) + -(-experts // edp)}.get(int(zero), sharded)
    return {"params": (sharded if zero == 3 else count) * precision.param_bytes,
            "grads": sharded * precision.dp_grad_bytes if zero >= 2 else count * precision.grad_bytes,
            "optim": optim_count * precision.optim_bytes + (sharded if zero >= 2 else count) * precision.master_bytes
            + sum(routing_bias_bytes(config, stage_count(schedule, pp), stage, balance)
                  for stage, _ in held_stages(schedule, pp, pp_rank))}


def block_activation_bytes(config, micro_batch_size, tp=1, sequence_parallel=False,
                           recompute=False, dtype="float32", cp=1, attention="dense"):
    """Activation bytes one block keeps for one micro-batch until its backward (s/cp tokens under cp;
    attention "flash": no probabilities, as under the ring)."""
    s, b, h, a = config.block_size // cp, micro_batch_size, config.d_model, config.n_head
    scale = get_precision(dtype).activation_bytes / 2
    if recompute:
        return 2 * s * b * h / (tp if sequence_parallel else 1) * scale
    keeps_scores = cp == 1 and attention == "dense"
    attention_scores = 5 * a * s / h if keeps_scores else 8  # ring or flash: q, k, v, output; no probabilities
    if sequence_parallel:
        return s * b * h * (34 + attention_scores) / tp * scale
    return s * b * h * (10 + 24 / tp + attention_scores / tp) * scale


def in_flight_micro_batches(schedule, micro_batches, pp, stage):
    """Micro-batches whose activations a stage holds at its peak (the schedule checker's
    count). Under zb-h1 / zb-h2 a micro-batch counts until its W, although between its B
    and W it keeps only the linear layers' inputs and output gradients: an upper bound."""
    # exercise 10.2: micro-batches in flight
    # hint: GPipe keeps every micro-batch's activations until its backward; 1F1B (and interleaved) at most
    # hint: pp − stage on a stage (its warm-up plus one), never more than there are micro-batches.
    if schedule == "gpipe":
        return micro_batches
    if schedule == "zb-h1":
        return min(micro_batches, pp)
    if schedule == "zb-h2":
        return min(micro_batches, 2 * pp - 1)
    return min(micro_batches, pp - stage)
    # end exercise


def activation_bytes_per_rank(config, layout, micro_batch_size, stage, dtype="float32",
                              balance=None):
    """Peak activation bytes of a rank at pipeline `stage` (under DualPipe(V) the larger of its two
    stages' blocks times the stage-micro-batches it holds, plan.dual)."""
    layers, in_flight = rank_in_flight(config, layout, stage, balance)
    kept = block_activation_bytes(config, micro_batch_size, layout.tp, layout.sequence_parallel,
                                  layout.recompute, dtype, layout.cp, layout.attention)
    total = layers * kept * in_flight
    if layout.recompute:
        total += block_activation_bytes(config, micro_batch_size, layout.tp,
                                        layout.sequence_parallel, False, dtype, layout.cp, layout.attention)
    return total


def rank_in_flight(config, layout, rank, balance=None):
    """(blocks per stage, stage-micro-batches in flight) of pipeline rank `rank` at its peak."""
    if layout.schedule not in DUAL:
        return (len(stage_blocks(config, layout.pp, rank, balance)),
                in_flight_micro_batches(layout.schedule, layout.micro_batches, layout.pp, rank))
    stages = stage_count(layout.schedule, layout.pp)
    layers = max(len(stage_blocks(config, stages, s, balance)) for s, _ in held_stages(layout.schedule, layout.pp, rank))
    return layers, in_flight_stages(layout.schedule, layout.micro_batches, layout.pp, rank)


def gathered_unit_bytes(config, layout, stage, dtype="float32", balance=None, prefetch=1):
    """ZeRO-3's transient parameters: the unit computing plus `prefetch` gathered ahead, at
    most (1 + prefetch) of the stage's largest unit (0 for the other stages)."""
    if layout.zero != 3:
        return 0
    units = rank_units(config, layout.tp, layout.pp, stage, balance, 1, layout.schedule)
    return (1 + prefetch) * max(dense for dense, _ in units) * get_precision(dtype).param_bytes


def memory_per_rank(config, layout, batch, rank_coords=(0, 0, 0), dtype="float32", balance=None):
    """{"params", "grads", "optim", "gathered", "activations", "total"} bytes of one rank."""
    _, _, stage = _coords(rank_coords)
    memory = param_bytes_per_rank(config, layout.dp, layout.tp, layout.pp, rank_coords, dtype,
                                  layout.zero, balance, layout.cp, layout.ep, layout.schedule)
    if layout.zero == 3:
        memory["gathered"] = gathered_unit_bytes(config, layout, stage, dtype, balance)
    memory["activations"] = activation_bytes_per_rank(
        config, layout, micro_batch_size(batch, layout), stage, dtype, balance)
    memory["total"] = sum(memory.values())
    return memory


def micro_batch_size(batch, layout):
    """Sequences per micro-batch on one dp rank."""
    per_step = layout.dp * layout.micro_batches
    if batch % per_step:
        raise ValueError(f"batch={batch} is not divisible by dp={layout.dp} × "
                         f"micro_batches={layout.micro_batches}")
    return batch // per_step


def peak_memory(config, layout, batch, dtype="float32", balance=None):
    """(stage, memory dict) of the pipeline stage with the largest total."""
    per_stage = [memory_per_rank(config, layout, batch, (0, 0, stage), dtype, balance)
                 for stage in range(layout.pp)]
    stage = max(range(layout.pp), key=lambda i: per_stage[i]["total"])
    return stage, per_stage[stage]
