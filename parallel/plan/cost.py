"""Step time of one layout: compute, α–β communication and the pipeline bubble.

Compute, per micro-batch of b sequences of s tokens (T = b·s) on one tp rank of
stage i holding L_i blocks:
    blocks:   L_i · (6·12·h²·T + 12·s·h·T) / tp      (matmuls fwd+bwd; attention
                                                     QKᵀ and AV: 12·b·s²·h per block)
              with recomputation the block forward runs twice: 8·12·h²·T + 16·s·h·T
    lm_head:  6·V·h·T / tp on the last stage
Summed over stages: 6·N·tokens + 12·n_layer·b·s²·h, N = 12·n_layer·h² + V·h (the weights that multiply
activations; embedding lookups cost no flops).
Seconds = flops / (peak flops of the dtype × the profile's efficiency). Under an FP8 recipe the blocks'
linears, passes·24·h²·T / tp per block (an MoE block's experts for its MLP), run at the float8 peak instead.

Communication, α latency per message and β = 1 / bandwidth seconds per byte, on the
intra-node link when the whole group fits in one node, the inter-node link otherwise:
    ring all-reduce                 2(n−1)(α + N/n·β)
    all-gather, reduce-scatter      (n−1)(α + N/n·β)
    send / recv                     α + N·β
tp: 4 all-reduces of b·s·h per block per micro-batch (2 forward, 2 backward; +2 when recomputation
    runs the forward again); sequence parallel: all-gather + reduce-scatter, the same volume and time.
pp: one send of b·s·h forward and one backward per micro-batch per stage.
dp: one all-reduce of the rank's gradients per step (ZeRO-1: reduce-scatter of the
    gradients + all-gather of the updated parameters); DualPipe adds one of all of them over
    the pair of pp ranks holding the two copies (tied.MirroredGradients), on the pp link.
cp: each rank computes its s/cp tokens (T = b·s/cp above; attention still sees all s keys),
    and per block and micro-batch passes K/V blocks of b·s/cp·h/tp around the ring:
    6·cp − 4 sends (context_parallel.layout.ring_elements; + 2(cp−1) when recomputation
    runs the forward again). They overlap the block's attention compute (each send is
    issued before the block before it is computed), so only the excess is charged:
    max(0, ring time − attention time). The dp gradients are reduced over dp·cp ranks.
fp8-current: every cast all-reduces its amax (one number) over tp and the tensor's replicas as it casts
    (amax_seconds): 4 casts per linear and micro-batch (6 when recomputed), 2(n−1)α each, latency only.
A mixture of experts: an MoE block's router and each token's k experts run whole on every
tp rank (2·(h·E + k·2·h·f) flops per token and pass, not divided by tp); per MoE block and
micro-batch over ep ranks, the counts and two row all-to-alls forward and two backward
(moe.all_to_all_seconds) and the balancing loss's all-reduce over cp or dp·cp ranks
(moe.balancing_seconds): together comm["ep"] (moe.moe_layer_seconds). The experts' gradients
are all-reduced over edp = dp/ep ranks beside the dense ones over dp. The slowest stage sets the pace:
step = (m + p − 1)·t_stage + t_dp, t_stage = compute + tp + pp time of one micro-batch, (p − 1)·t_stage the
bubble. DualPipe(V) (plan.dual): a rank's t_stage sums its two stages' times by their shares of m;
the bubble is DeepSeek-V3's table 2. The zero-bubble schedules (zb-h1, zb-h2) split each backward into B
and W, one pass each like the forward (F = B = W = t_stage/3), and fill all but (p − 1 + max(0, p − m))·
t_stage/3 of it with W's: a third of 1F1B's once m ≥ p (pipeline.zero_bubble). With recomputation the W's
run inside B (the recomputed graph is backpropagated whole), so the bubble stays 1F1B's.
"""
from dataclasses import dataclass, field
from functools import partial

from ..alpha_beta import all_gather, ring_all_reduce, send_recv
from ..context_parallel.layout import ring_elements
from .compress import dp_time as dp_communication
from .compress import stage_matrices
from .dual import DUAL, dual_bubble_slots, dual_error, held_stages, per_rank, stage_count
from .flops import fp8_seconds, stage_flops
from .layout import get_precision
from .memory import block_activation_bytes, micro_batch_size, peak_memory, rank_in_flight, rank_units
from .model import has_experts, moe_blocks, stage_blocks, stage_layers
from .moe import moe_layer_seconds
from .profiles import load_profile, peak_flops


def link(profile, stride, size):
    """(kind, α seconds, β seconds/byte) for a group of `size` ranks `stride` apart."""
    kind = "intra" if stride * size <= profile["devices_per_node"] else "inter"
    figures = profile[kind]
    return kind, figures["alpha_us"] * 1e-6, 1 / (figures["bandwidth_gbps"] * 1e9)


def ring_time(config, layout, b, rate, alpha, beta, bytes_per_element):
    """Exposed seconds of one block's cp ring per micro-batch: the K/V (and dK/dV) sends
    beyond what the block's attention compute hides (see the module doc)."""
    s, h, cp = config.block_size, config.d_model, layout.cp
    per_pass = ring_elements(b, s, h // layout.tp, cp)
    elements = per_pass["forward"] * (2 if layout.recompute else 1) + per_pass["backward"]
    block = b * (s // cp) * (h // layout.tp)
    ring = (elements // block) * alpha + elements * bytes_per_element * beta
    passes = 4 if layout.recompute else 3
    attention = passes * 4 * s * h * (b * s // cp) / layout.tp / rate
    return max(0.0, ring - attention)


def bubble_slots(schedule, p, m, recompute=False):
    """The bubble of one step in units of t_stage (see the module docstring)."""
    if schedule in DUAL:
        return dual_bubble_slots(schedule, p, recompute)
    if schedule in ("zb-h1", "zb-h2") and not recompute:
        return (p - 1 + max(0, p - m)) / 3
    return p - 1


@dataclass
class Estimate:
    layout: object
    memory: dict                 # bytes of the peak-memory stage: params, grads, optim, activations, total
    memory_stage: int
    time: dict                   # seconds: compute, comm, bubble, total
    comm: dict                   # seconds per step: tp, pp, dp
    lines: list = field(default_factory=list)
    balance: list = None         # blocks per stage when not the even split

    def reason(self):
        shares = {"bubble": self.time["bubble"], **{f"{k} comm": v for k, v in self.comm.items()}}
        worst = max(shares, key=shares.get)
        pct = 100 * shares[worst] / self.time["total"]
        return f"{worst} {pct:.2g}%" if pct else "no overhead"


def check_experts_layout(config, layout):
    """What HybridGPT composes with a mixture of experts (ValueError otherwise)."""
    if has_experts(config):
        if config.n_experts % layout.ep:
            raise ValueError(f"n_experts={config.n_experts} is not divisible by ep={layout.ep}")
        if layout.sequence_parallel:
            raise ValueError(f"a mixture of experts under {layout.name()} {layout.flags()}: sequence "
                             "parallelism is not composed with experts (they run whole on every tp rank)")
    elif layout.ep > 1:
        raise ValueError(f"ep={layout.ep} needs a mixture of experts (config.n_experts > 0)")


def amax_seconds(config, layout, blocks, link_of):
    """fp8-current's amax all-reduces per micro-batch on a stage holding `blocks` (minitensor.fp8.recipe):
    each cast (x, W, and dY for dgrad and for wgrad; x and W again when recomputed) reduces one number
    over tp and over the replicas: dp × cp for a block's 6 linears (an MoE block: attention's 4 and
    2 per shared expert), edp for 2 per local routed expert (E/ep, each cast even without tokens)."""
    def one(stride, n):
        return ring_all_reduce(n, 4, *link_of(stride, n)[1:])

    tp, edp = one(1, layout.tp), layout.dp // layout.ep * layout.cp
    moe = moe_blocks(config, blocks)
    dense = (6 * (len(blocks) - moe) + moe * (4 + 2 * config.shared_experts)) * (tp + one(layout.tp, layout.dp * layout.cp))
    routed = moe * 2 * (config.n_experts // layout.ep) * (tp + one(layout.tp * layout.ep, edp))
    return (6 if layout.recompute else 4) * (dense + routed)


def sharded_seconds(zero, ranks, grad_bytes, gather_bytes, m, alpha, beta):
    """(seconds, how) of ZeRO's reduction over `ranks`: ZeRO-3 all-gathers the parameters for each
    micro-batch's forward and backward and reduce-scatters the gradients; ZeRO-1/2 reduce-scatter
    and all-gather once (a reduce-scatter costs what an all-gather of the same bytes costs)."""
    if zero == 3:
        return (2 * m * all_gather(ranks, gather_bytes, alpha, beta) + all_gather(ranks, grad_bytes, alpha, beta),
                f"{2 * m} all-gathers (forward and backward of {m} micro-batch(es)) + reduce-scatter")
    return all_gather(ranks, grad_bytes, alpha, beta) + all_gather(ranks, gather_bytes, alpha, beta), \
        "reduce-scatter + all-gather"


def dp_seconds(config, layout, profile, precision, balance=None, compress="none", local_steps=1):
    """(seconds, explanation) of one step's dp × cp communication, on the largest stage's
    parameters: the gradient reduction, and ZeRO's parameter all-gathers; under expert
    parallelism the experts' over their own replicas, edp."""
    p, m, replicas = layout.pp, layout.micro_batches, layout.dp * layout.cp
    dp_kind, dp_alpha, dp_beta = link(profile, layout.tp, replicas)
    units = [rank_units(config, layout.tp, p, i, balance, layout.ep, layout.schedule) for i in range(p)]
    stage = max(range(p), key=lambda i: sum(map(sum, units[i])))  # the first of the largest stages
    stages, held = stage_count(layout.schedule, p), held_stages(layout.schedule, p, stage)
    count, experts = (sum(column) for column in zip(*units[stage]))  # experts: reduced over edp = (dp/ep)·cp
    # ZeRO-2/3 all-gather the compute copies (16-bit under a mixed policy), ZeRO-1 the masters
    gather_bytes = precision.param_bytes if layout.zero >= 2 else precision.dp_grad_bytes
    grad_bytes = count * precision.dp_grad_bytes  # under a mixed policy the float32 master gradients
    if layout.zero:
        dp_time, dp_how = sharded_seconds(layout.zero, replicas, grad_bytes, count * gather_bytes, m, dp_alpha, dp_beta)
    else:
        dp_time, dp_how = dp_communication(
            count, [shape for s, _ in held for shape in stage_matrices(config, layout.tp, stages, s, balance)],
            replicas, precision.grad_bytes, compress, local_steps, dp_alpha, dp_beta, ring_all_reduce, all_gather)
    line = f"dp: {dp_how} of {grad_bytes} B over {replicas} ranks ({dp_kind}) = {dp_time:.4g} s"
    expert_time = 0.0
    if experts:
        edp = layout.dp // layout.ep * layout.cp
        _, edp_alpha, edp_beta = link(profile, layout.tp * layout.ep, edp)  # edp: every ep-th dp rank
        expert_bytes = experts * precision.dp_grad_bytes
        expert_time, how = (sharded_seconds(layout.zero, edp, expert_bytes, experts * gather_bytes, m, edp_alpha,
                                            edp_beta) if layout.zero else
                            (ring_all_reduce(edp, expert_bytes, edp_alpha, edp_beta), "all-reduce"))
        line += f"; experts: {how} of {expert_bytes} B over edp = {edp} ranks = {expert_time:.4g} s"
    if layout.schedule == "dualpipe":  # every gradient summed with the pair rank's copy, before the replicas'
        mirror = ring_all_reduce(2, (count + experts) * precision.dp_grad_bytes, *link(profile, layout.tp * replicas, p)[1:])
        line, expert_time = line + f"; mirrored copies over the pp pair: {mirror:.4g} s", expert_time + mirror
    return dp_time + expert_time, line


def estimate(config, layout, batch, profile, dtype="float32", balance=None, compress="none", local_steps=1):
    """Memory and step time of `layout` training `config` on `batch` sequences per step.

    `profile` is a profile dict or a name for `load_profile`; `compress` (a --compress
    value) and `local_steps` change the dp communication (plan.compress)."""
    profile = load_profile(profile) if isinstance(profile, str) else profile
    precision = get_precision(dtype)
    check_experts_layout(config, layout)
    b = micro_batch_size(batch, layout)
    s, h, m, p, cp = config.block_size, config.d_model, layout.micro_batches, layout.pp, layout.cp
    if layout.schedule in DUAL and dual_error(layout.schedule, p, m, config.n_layer):
        raise ValueError(dual_error(layout.schedule, p, m, config.n_layer))
    tokens, stages = b * s // cp, stage_count(layout.schedule, p)
    flops_key, peak = peak_flops(profile, precision)
    rate = peak * profile["efficiency"]
    layers = stage_layers(config.n_layer, stages, balance)
    lines = [f"layout {layout.name()} m={m} flags={layout.flags()} dtype={dtype} "
             f"device={profile['name']}",
             f"micro-batch b = batch / (dp·m) = {batch} / ({layout.dp}·{m}) = {b}; "
             f"T = b·s{'/cp' if cp > 1 else ''} = {tokens} tokens; blocks per stage {layers}"]

    activation = tokens * h * precision.activation_bytes
    tp_kind, tp_alpha, tp_beta = link(profile, 1, layout.tp)
    tp_collectives = (6 if layout.recompute else 4)
    tp_one = ring_all_reduce(layout.tp, activation, tp_alpha, tp_beta)
    pp_kind, pp_alpha, pp_beta = link(profile, layout.tp * cp * layout.dp, p)
    cp_block = 0.0
    if cp > 1:
        cp_kind, cp_alpha, cp_beta = link(profile, layout.tp, cp)
        cp_block = ring_time(config, layout, b, rate, cp_alpha, cp_beta, precision.activation_bytes)
        lines.append(f"cp ring ({cp_kind}): exposed {cp_block:.3g} s per block and micro-batch")
    pp_mb = 2 * send_recv(activation, pp_alpha, pp_beta) if p > 1 else 0.0
    ep_layer, ep_lines = moe_layer_seconds(config, layout, b, precision.activation_bytes, partial(link, profile))
    lines += ep_lines
    lines.append(f"rate = peak[{flops_key}] {peak:.3g} × efficiency {profile['efficiency']} "
                 f"= {rate:.3g} flop/s")
    lines.append(f"activation message b·s·h·{precision.activation_bytes} B = {activation} B; tp link {tp_kind}, pp link {pp_kind}")

    stage_times = []
    for stage, count in enumerate(layers):
        blocks = stage_blocks(config, stages, stage, balance)
        flops = stage_flops(config, count, tokens, layout.tp, layout.recompute, stage == stages - 1, blocks.start)
        compute = flops / rate - fp8_seconds(profile, precision, config, blocks, tokens, layout.tp, layout.recompute, rate)
        tp_mb, cp_mb = count * tp_collectives * tp_one, count * cp_block
        ep_mb = moe_blocks(config, blocks) * ep_layer
        amax_mb = amax_seconds(config, layout, blocks, partial(link, profile)) if precision.name == "fp8-current" else 0.0
        stage_times.append((compute + tp_mb + cp_mb + pp_mb + ep_mb + amax_mb, compute, tp_mb, cp_mb, ep_mb, pp_mb,
                            amax_mb))
        lines.append(f"stage {stage}: flops/mb = {flops:.4g} → compute {compute:.4g} s; "
                     f"tp {count} blocks × {tp_collectives} all-reduce × {tp_one:.3g} s "
                     f"= {tp_mb:.4g} s; pp 2 × p2p = {pp_mb:.4g} s")
    rank_times = list(zip(*(per_rank(layout.schedule, p, column) for column in zip(*stage_times))))  # plan.dual
    slowest = max(range(p), key=lambda i: rank_times[i][0])
    t_stage, compute_mb, tp_mb, cp_mb, ep_mb, pp_mb, amax_mb = rank_times[slowest]
    if layout.schedule in DUAL:
        lines.append(f"{layout.schedule}: (stage, share of m) per rank {[held_stages(layout.schedule, p, r) for r in range(p)]}"
                     f", per micro-batch {', '.join(f'{t[0]:.4g}' for t in rank_times)} s")

    dp_time, dp_line = dp_seconds(config, layout, profile, precision, balance, compress, local_steps)
    lines.append(dp_line)

    comm = {"tp": m * tp_mb, "pp": m * pp_mb, "dp": dp_time, **({"cp": m * cp_mb} if cp > 1 else {}),
            **({"ep": m * ep_mb} if ep_layer else {}), **({"fp8 amax": m * amax_mb} if amax_mb else {})}
    slots = bubble_slots(layout.schedule, p, m, layout.recompute)
    time = {"compute": m * compute_mb, "comm": sum(comm.values()), "bubble": slots * t_stage}
    time["total"] = sum(time.values())
    lines.append(f"slowest stage {slowest}: t_stage = {t_stage:.4g} s; compute = m·{compute_mb:.4g}"
                 f" = {time['compute']:.4g} s; comm = m·({tp_mb:.4g} + {pp_mb:.4g}"
                 f"{f' + cp {cp_mb:.4g}' if cp > 1 else ''}{f' + ep {ep_mb:.4g}' if ep_layer else ''}"
                 f"{f' + fp8 amax {amax_mb:.4g}' if amax_mb else ''}) + "
                 f"{dp_time:.4g} = {time['comm']:.4g} s")
    lines.append(f"bubble = {slots:.4g}·t_stage ({layout.schedule}) = {slots:.4g}·{t_stage:.4g} = "
                 f"{time['bubble']:.4g} s (fraction {slots / (m + slots):.3f} of the pipelined time)")
    lines.append(f"step time = {time['total']:.4g} s")

    stage, memory = peak_memory(config, layout, batch, dtype, balance)
    lines += memory_lines(config, layout, b, stage, precision, balance)
    lines.append(f"memory (stage {stage}, the largest): params {memory['params']} B, grads "
                 f"{memory['grads']} B, optim {memory['optim']} B"
                 f"{f' (ZeRO-{layout.zero}: sharded over dp)' if layout.zero else ''}, activations "
                 f"{memory['activations']:.0f} B = {memory['total'] / 2**30:.4g} GiB")
    return Estimate(layout, memory, stage, time, comm, lines, balance)


def memory_lines(config, layout, b, stage, precision, balance):
    """How the peak stage's memory figures come about, for --explain."""
    count = sum(map(sum, rank_units(config, layout.tp, layout.pp, stage, balance, layout.ep, layout.schedule)))
    layers, in_flight = rank_in_flight(config, layout, stage, balance)
    kept = block_activation_bytes(config, b, layout.tp, layout.sequence_parallel,
                                  layout.recompute, precision.name, layout.cp, layout.attention)
    s, h, a, t = config.block_size // layout.cp, config.d_model, config.n_head, layout.tp
    if layout.recompute:
        formula = f"2·s·b·h{'/t' if layout.sequence_parallel else ''} (block input only)"
    elif layout.cp > 1 or layout.attention == "flash":  # ring or flash: q, k, v, output, no probabilities
        seq = " (s = seq/cp)" if layout.cp > 1 else ""
        formula = "s·b·h·(34 + 8)/t" if layout.sequence_parallel else f"s·b·h·(10 + 24/t + 8/t){seq}"
    elif layout.sequence_parallel:
        formula = "s·b·h·(34 + 5·a·s/h)/t"
    else:
        formula = "s·b·h·(10 + 24/t + 5·a·s/(h·t))"
    lines = [f"stage {stage} holds {count} parameters × ({precision.param_bytes} param + "
             f"{precision.grad_bytes} grad + {precision.optim_bytes} optim) bytes"
             f"{f', ZeRO-{layout.zero} over dp={layout.dp} (param_bytes_per_rank)' if layout.zero else ''}",
             f"activations per block per micro-batch {formula} × {precision.activation_bytes}/2 "
             f"with s={s} b={b} h={h} a={a} t={t} = {kept:.0f} B",
             f"activations = {layers} blocks × {kept:.0f} B × {in_flight} micro-batches in flight "
             f"({layout.schedule})"]
    if layout.recompute:
        lines.append("  + one block's full activations while it is recomputed")
    return lines
