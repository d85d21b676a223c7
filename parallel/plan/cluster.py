"""The step a GPU cluster runs: Megatron-LM's GPT (Narayanan et al. 2021) on a profile's `cluster` figures.

The device figures are data (profiles.json, `cluster` and `cluster_sources`: datasheet or published
microbenchmark; one, the GEMM efficiency, fitted on Narayanan et al. 2021's Table 2, published_sweeps.py).
What is counted here is the *software*: which kernels Megatron-LM (2021) launches per transformer
block, how many bytes each memory-bound one moves, and which communication it overlaps (tp all-reduces
and pipeline sends sit on the critical path in that code; so does the dp all-reduce with its own DDP,
ddp="local", which reduces after the backward; see ddp_seconds for ddp="torch"). The layout: tp = t, pp = p, dp = d, micro-batch b sequences,
v model chunks per stage (interleaved 1F1B; v = 1 is plain 1F1B), full activation recomputation
(the default; Table 1's runs) or, as in Korthikanti et al. 2022, selective recomputation (only core
attention reruns) and sequence parallelism (SP). The 2022 code's overlaps (the backward's tp
collectives with the wgrad GEMMs) and its fused wgrad accumulation are not modelled.

Per block and micro-batch on one GPU (T = b·s tokens, a heads, h hidden):
  GEMMs      qkv (T, 3h/t, h), scores (s, s, h/a) × b·a/t, context (s, h/a, s) × b·a/t,
             proj (T, h, h/t), fc1 (T, 4h/t, h), fc2 (T, h, 4h/t); each runs forward twice
             (recomputation; selective: only scores and context) and backward as dgrad (M, K, N) + wgrad (K, N, M). A GEMM costs
             max(its tile- and wave-quantized flops at gemm_efficiency·peak, its bytes at HBM speed).
  memory     the kernels between GEMMs, bytes counted below at hbm_efficiency·HBM bandwidth:
  bound      LayerNorms, bias-dropout-adds (replicated on every tp rank unless SP splits them),
             bias-GELU (sharded), softmax + dropout of the a·s² scores,
             and the fp32 main-grad accumulation of every weight after each micro-batch.
  tp         6 ring all-reduces of b·s·h·2 bytes (2 forward, 2 recomputed, 2 backward; selective 4),
             NVLink; SP: an all-gather + a reduce-scatter each instead, the same bytes.
  pp         per micro-batch and chunk one send forward and one backward of b·s·h·2 bytes; across
             nodes each tp rank sends 1/t of it on its own NIC and the stage all-gathers it on NVLink
             (Megatron's scatter/gather optimisation).
The first stage adds the embedding (memory-bound: its lookup, scatter-add and main-grad), the last
the lm_head GEMM (3 passes) and the cross-entropy; where p does not divide the layers (v = 1), the
stages hold unequal block counts (stage_split.py: even, or balanced with the ends costed). The
slowest stage paces the pipeline: pipelined = (m + (p − 1)/v)·t_stage, m = batch/(d·b) micro-batches (the bubble is the
(p − 1)/v part). Then, not overlapped: the dp ring all-reduce of the gradients (a group with k
members per node moves at min(NVLink, k NICs); with torch DDP partly hidden, see ddp_seconds), the
first/last stage all-reduce of the tied embedding's gradient, and the optimizer (Adam on fp32
masters, memory-bound).
TFLOP/s per GPU counts the paper's model flops (its eq. 3): 96·B·s·l·h²·(1 + s/6h + V/16lh).
DualPipe and DualPipeV (schedule, v = 1; plan.dual): a rank's time sums its two stages' by their shares,
the bubble is DeepSeek-V3's table 2 with F : B : W = 1 : 3 : 0 under full recomputation (W runs inside
B) and 1 : 2 : 1 under selective; DualPipe's mirrored copies all-reduce their gradients in pairs.
"""
from dataclasses import dataclass
from math import ceil

from ..alpha_beta import all_gather, ring_all_reduce
from .cluster_memory import DTYPE, activation_bytes
from .dual import DUAL, dual_bubble_slots, dual_error, held_stages, per_rank, stage_count
from .layout import Layout, get_precision
from .memory import peak_memory
from .stage_split import stage_seconds, stage_split

SCHEDULES = ("1f1b",) + DUAL        # 1f1b: interleaved when v > 1

# Bytes moved by Megatron-LM's memory-bound kernels, counted from its code (fp16 activations), as
# (forward, backward) per pass; a recomputed kernel runs its forward twice:
REPLICATED_BYTES_PER_TOKEN_H = (22, 24)  # 2 LayerNorms (r 2h, w 2h) + 2 bias-dropout-adds (r 4h, w 2h, mask h);
                                    # per token, in units of h; / t under sequence parallelism
GELU_BYTES_PER_TOKEN_H = (16, 24)   # bias-GELU on 4h/t (units h/t)
COPY_BYTES_PER_TOKEN_H = (4, 4)     # the context layer's permute().contiguous() (units h/t), in core attention
SCORE_BYTES = (9, 11)               # per attention score: softmax (r2 w2) + dropout (r2 w2 mask 1) forward;
                                    # backward dropout 5 + softmax 6; in core attention
MAIN_GRAD_BYTES = 6                 # per weight per micro-batch: main_grad += grad, fp16 (r 2 + 2, w 2): --fp16
                                    # keeps main_grad in fp16 (accumulate_allreduce_grads_in_fp32 is off)
CROSS_ENTROPY_BYTES = 40            # per logit: fp16 → fp32, max, exp, sum, and the backward's passes
OPTIMIZER_BYTES = 46                # per parameter per step: Adam on fp32 master, m, v (r/w 24), grad
                                    # unscale + inf check + norm (12), fp16 copy (2), zero main_grad (4), ...
RECOMPUTE = ("full", "selective")
DDP = ("local", "torch")            # Megatron-LM's --DDP-impl
BACKWARD_SHARE = 3 / 4              # of a block's time with full recomputation: forward F, recompute F,
                                    # backward 2F (dgrad + wgrad), the count behind the paper's eq. 3 (sec. 5.1);
                                    # by flops, so it ignores that the forward's share of memory-bound time differs


def figures(profile):
    if "cluster" not in profile:
        raise ValueError(f"device {profile.get('name')!r} has no 'cluster' figures (profiles.json); "
                         "known: a100-80gb, v100-32gb, h100-80gb")
    return profile["cluster"]


def gemm_seconds(gpu, m, n, k, batch=1):
    """One (batched) GEMM: the cheapest thread-block tile, every wave of `sms` tiles paid in full, at
    gemm_efficiency of peak — or its bytes at the HBM speed if that is longer (small K, e.g. scores)."""
    rate = gpu["peak_flops"] * gpu["gemm_efficiency"]
    compute = min(ceil(ceil(m / tm) * ceil(n / tn) * batch / gpu["sms"]) * gpu["sms"] * 2 * tm * tn * k
                  for tm, tn in gpu["gemm_tiles"]) / rate
    return max(compute, memory_seconds(gpu, 2 * batch * (m * k + k * n + m * n)))


def memory_seconds(gpu, nbytes):
    return nbytes / (gpu["hbm_bytes_per_s"] * gpu["hbm_efficiency"])


def training_gemm(gpu, m, n, k, batch=1, forwards=2):
    """Forward `forwards` times (2 with recomputation), backward as dgrad + wgrad."""
    return (forwards * gemm_seconds(gpu, m, n, k, batch) + gemm_seconds(gpu, m, k, n, batch)
            + gemm_seconds(gpu, k, n, m, batch))


def nvlink(gpu):
    return gpu["nvlink_alpha_us"] * 1e-6, 1 / (gpu["nvlink_bytes_per_s"] * gpu["nvlink_efficiency"])


def group_link(gpu, stride, size):
    """(α, β) of a group of `size` GPUs `stride` apart: NVLink inside a node, else the k members per
    node bring k NICs (NCCL's rings use them all), at most NVLink's speed."""
    if stride * size <= gpu["gpus_per_node"]:
        return nvlink(gpu)
    per_node = max(1, min(size, gpu["gpus_per_node"] // stride))
    speed = min(gpu["nvlink_bytes_per_s"] * gpu["nvlink_efficiency"],
                per_node * gpu["nic_bytes_per_s"] * gpu["nic_efficiency"])
    return gpu["nic_alpha_us"] * 1e-6, 1 / speed


def passes(kernel_bytes, recomputed):
    """A kernel's bytes over forward, its recomputation if any, and backward."""
    forward, backward = kernel_bytes
    return forward * (2 if recomputed else 1) + backward


def block_seconds(config, gpu, t, b, recompute="full", sequence_parallel=False):
    """{gemm, memory, tp} seconds of one block, one micro-batch, forward + recompute + backward.
    recompute="full" reruns the whole block's forward; "selective" (Korthikanti et al. 2022) only core
    attention (both batched GEMMs, softmax, dropout, the context copy). Sequence parallelism splits the
    LayerNorms and dropouts over the t ranks and turns each all-reduce into an all-gather before the
    block's half and a reduce-scatter after it (the same bytes)."""
    s, h, a = config.block_size, config.d_model, config.n_head
    tokens, full = b * s, recompute == "full"
    linear = 2 if full else 1
    gemm = (training_gemm(gpu, tokens, 3 * h // t, h, forwards=linear)
            + training_gemm(gpu, s, s, h // a, b * a // t) + training_gemm(gpu, s, h // a, s, b * a // t)
            + training_gemm(gpu, tokens, h, h // t, forwards=linear)
            + training_gemm(gpu, tokens, 4 * h // t, h, forwards=linear)
            + training_gemm(gpu, tokens, h, 4 * h // t, forwards=linear))
    replicated = passes(REPLICATED_BYTES_PER_TOKEN_H, full) / (t if sequence_parallel else 1)
    sharded = (passes(GELU_BYTES_PER_TOKEN_H, full) + passes(COPY_BYTES_PER_TOKEN_H, True)) / t
    nbytes = (tokens * h * (replicated + sharded) + passes(SCORE_BYTES, True) * b * a * s * s / t
              + MAIN_GRAD_BYTES * 12 * h * h / t)
    alpha, beta = nvlink(gpu)
    collectives = 2 * (3 if full else 2)      # 2 per forward pass, 2 backward
    one = (2 * all_gather(t, 2 * tokens * h, alpha, beta) if sequence_parallel
           else ring_all_reduce(t, 2 * tokens * h, alpha, beta))
    return {"gemm": gemm, "memory": memory_seconds(gpu, nbytes), "tp": collectives * one if t > 1 else 0.0}


def head_seconds(config, gpu, t, b):
    """The last stage's lm_head (vocab-parallel, 3 passes), its cross-entropy, and the main-grad
    accumulation of its (tied) weight, one micro-batch."""
    tokens, vocab = b * config.block_size, -(-config.vocab_size // t)
    return (training_gemm(gpu, tokens, vocab, config.d_model, forwards=1)
            + memory_seconds(gpu, CROSS_ENTROPY_BYTES * tokens * vocab + MAIN_GRAD_BYTES * vocab * config.d_model))


def embed_seconds(config, gpu, t, b):
    """The first stage's embedding, one micro-batch: the lookup writes b·s·h, the backward reads the
    gradient and scatter-adds it (2 bytes each, fp16), and the main-grad accumulation of its weight
    shard (vocab/t rows)."""
    tokens, vocab = b * config.block_size, -(-config.vocab_size // t)
    return memory_seconds(gpu, 3 * 2 * tokens * config.d_model + MAIN_GRAD_BYTES * vocab * config.d_model)


def p2p_seconds(gpu, t, dp, p, nbytes):
    """One activation (or its gradient) from a stage to the next."""
    if t * dp * p <= gpu["gpus_per_node"] or p == 1:
        alpha, beta = nvlink(gpu)
        return alpha + nbytes * beta
    alpha, beta = gpu["nic_alpha_us"] * 1e-6, 1 / (gpu["nic_bytes_per_s"] * gpu["nic_efficiency"])
    send = alpha + nbytes / t * beta
    return send + (all_gather(t, nbytes, *nvlink(gpu)) if t > 1 else 0.0)


def model_flops(config, batch):
    """The paper's eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh), recomputation included."""
    s, l, h, vocab = config.block_size, config.n_layer, config.d_model, config.vocab_size
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))


@dataclass
class Step:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    chunks: int
    seconds: dict
    memory: dict
    limit: float
    tflops: float
    recompute: str = "full"
    sequence_parallel: bool = False
    ddp: str = "local"
    split: list = None                # blocks per pipeline stage
    schedule: str = "1f1b"

    @property
    def fits(self):
        return self.memory["total"] <= self.limit

    def as_json(self):
        return {"layout": {"tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batch": self.micro_batch,
                           "micro_batches": None, "v": self.chunks, "recompute": self.recompute,
                           "split": self.split, "schedule": self.schedule},
                "sequence_parallel": self.sequence_parallel, "ddp": self.ddp,
                "step_seconds": self.seconds["step"], "tflops_per_device": self.tflops,
                "memory_bytes_per_device": self.memory["total"], "memory_limit_bytes": self.limit,
                "fits": self.fits, "seconds": self.seconds, "memory": self.memory}


def layout_error(config, devices, batch, tp, pp, dp, b, v, gpus_per_node, recompute="full", sequence_parallel=False,
                 ddp="local", schedule="1f1b"):
    """Why (tp, pp, dp, b, v, recompute, sequence parallelism, DDP, schedule) cannot run, or None."""
    dual = dual_error(schedule, pp, batch // (dp * b), config.n_layer) if schedule in DUAL and not batch % (dp * b) else None
    checks = [(tp * pp * dp == devices, f"tp·pp·dp = {tp * pp * dp} is not --devices {devices}"),
              (config.n_head % tp == 0, f"tp={tp} does not divide n_head={config.n_head}"),
              (tp <= gpus_per_node, f"tp={tp} spans nodes of {gpus_per_node} GPUs"),
              (pp <= config.n_layer, f"pp={pp} stages exceed n_layer={config.n_layer} blocks"),
              (v == 1 or config.n_layer % (pp * v) == 0,
               f"interleaving: pp·v = {pp * v} does not divide n_layer={config.n_layer}"),
              (batch % (dp * b) == 0, f"batch={batch} is not divisible by dp·m = {dp}·{b}"),
              (v == 1 or (pp > 1 and batch // (dp * b) % pp == 0),
               f"interleaving (v={v}) needs pp > 1 and micro-batches divisible by pp={pp}"),
              (recompute in RECOMPUTE, f"recompute={recompute!r} is not one of {RECOMPUTE}"),
              (tp > 1 or not sequence_parallel, "sequence parallelism needs tp > 1"),
              (ddp in DDP, f"ddp={ddp!r} is not one of {DDP}"),
              # Megatron-LM 2021 (megatron/training.py) asserts --DDP-impl local with pipelining or chunks
              (ddp == "local" or (pp == 1 and recompute == "full"),
               "torch DDP needs pp = 1 (Megatron-LM 2021) and is modelled with full recomputation only"),
              (schedule in SCHEDULES and (schedule == "1f1b" or v == 1), f"schedule={schedule!r}: one of {SCHEDULES}, "
               "DualPipe(V) with v = 1 (they hold two stages per rank their own way)"),
              (dual is None, dual)]
    return next((why for ok, why in checks if not ok), None)


def ddp_seconds(ddp, all_reduce, tail, last_backward):
    """The dp all-reduce's time on the critical path. "local" (Megatron's DDP): all of it, after the
    backward. "torch" (PyTorch DistributedDataParallel, Li et al., VLDB 2020, arXiv:2006.15704, sec. 3.2:
    gradients all-reduced in buckets, 25 MB by default, while the backward still runs): Megatron-LM 2021
    (megatron/schedules.py, forward_backward_no_pipelining) runs all but the last micro-batch under
    no_sync, so only the last micro-batch's backward can hide it; the bucket holding the tied word
    embedding (its gradient is complete only when the backward ends) is always exposed, `tail`."""
    if ddp == "local":
        return all_reduce
    return max(tail, all_reduce - last_backward)


def step(config, profile, batch, tp, pp, dp, b, v=1, recompute="full", sequence_parallel=False, ddp="local",
         split="even", schedule="1f1b"):
    """The Step of one layout (ValueError if it cannot run); see the module docstring. split: how
    the blocks are cut into the stages when v = 1 (stage_split.SPLITS; 2·pp stages in the V)."""
    gpu = figures(profile)
    why = layout_error(config, tp * pp * dp, batch, tp, pp, dp, b, v, gpu["gpus_per_node"], recompute,
                       sequence_parallel, ddp, schedule)
    if why:
        raise ValueError(why)
    m, s, h = batch // (dp * b), config.block_size, config.d_model
    block = block_seconds(config, gpu, tp, b, recompute, sequence_parallel)
    per_block = sum(block.values())
    p2p = 2 * v * p2p_seconds(gpu, tp, dp, pp, 2 * b * s * h) if pp > 1 else 0.0
    head, embed = head_seconds(config, gpu, tp, b), embed_seconds(config, gpu, tp, b)
    blocks = (stage_split(config.n_layer, stage_count(schedule, pp), split, per_block, embed, head) if v == 1
              else [config.n_layer // pp] * pp)
    times = per_rank(schedule, pp, stage_seconds(blocks, per_block, embed, head, p2p))
    slowest = max(range(pp), key=times.__getitem__)
    stage, layers = times[slowest], per_rank(schedule, pp, blocks)[slowest]
    ends = per_rank(schedule, pp, stage_seconds(blocks, 0.0, embed, head, 0.0))[slowest]
    precision = get_precision(DTYPE)
    layout = Layout(dp=dp, tp=tp, pp=pp, micro_batches=m, recompute=True, sequence_parallel=sequence_parallel,
                    schedule=schedule)
    _, memory = peak_memory(config, layout, batch, DTYPE, blocks)
    params = memory["params"] / precision.param_bytes
    embedding_grad = -(-config.vocab_size // tp) * h * precision.dp_grad_bytes  # the tied word embedding's
    dp_time = 0.0
    if dp > 1:
        alpha, beta = group_link(gpu, tp, dp)
        dp_time = ddp_seconds(ddp, ring_all_reduce(dp, params * precision.dp_grad_bytes, alpha, beta),
                              ring_all_reduce(dp, embedding_grad, alpha, beta), BACKWARD_SHARE * layers * per_block)
    embedding = ring_all_reduce(2, embedding_grad, *group_link(gpu, tp * dp * (pp - 1), 2)) if pp > 1 else 0.0
    if schedule in DUAL:  # the V holds both ends on rank 0; DualPipe sums both its stages' gradients with the
        embedding = ring_all_reduce(2, params * precision.dp_grad_bytes, *group_link(gpu, tp * dp, 2)) \
            if schedule == "dualpipe" else 0.0  # pair rank holding their other copies (all `params` of the rank)
    seconds = {"compute": m * (layers * (block["gemm"] + block["memory"]) + ends),
               "gemm": m * layers * block["gemm"], "memory_bound": m * layers * block["memory"],
               "tp": m * layers * block["tp"], "pp": m * p2p * sum(share for _, share in held_stages(schedule, pp, slowest)),
               "bubble": (dual_bubble_slots(schedule, pp, recompute == "full") if schedule in DUAL else (pp - 1) / v) * stage,
               "dp": dp_time, "embedding_sync": embedding,
               "optimizer": memory_seconds(gpu, OPTIMIZER_BYTES * params)}
    seconds["step"] = m * stage + seconds["bubble"] + dp_time + embedding + seconds["optimizer"]
    memory = {**memory, "activations": activation_bytes(config, b, tp, pp, v, m, recompute, sequence_parallel, blocks,
                                                        schedule)}
    memory["logits"] = 6 * b * s * (-(-config.vocab_size // tp))  # fp16 logits + their fp32 copy, last stage
    # the optimizer step copies every gradient to fp32 (main_param.grad = main_grad.float()) once the
    # activations are gone: the peak is the larger of the two
    memory["fp32_grads_at_step"] = 4 * params
    if ddp == "torch":  # its buckets hold a second copy of the gradients (PyTorch's docs, DDP's
        memory["ddp_buckets"] = params * precision.dp_grad_bytes  # gradient_as_bucket_view: off by default)
    states = memory["params"] + memory["grads"] + memory["optim"] + memory.get("ddp_buckets", 0)
    memory["total"] = states + max(memory["activations"] + memory["logits"], memory["fp32_grads_at_step"])
    tflops = model_flops(config, batch) / (seconds["step"] * tp * pp * dp) / 1e12
    return Step(tp, pp, dp, b, v, seconds, memory, profile["memory_gib"] * 2**30, tflops, recompute,
                sequence_parallel, ddp, blocks, schedule)
