"""The GPT-2 style model the planner reasons about, and its exact parameter counts.

The architecture is fixed (see `minitensor.models`): token + learned position
embeddings, `n_layer` pre-LN blocks, a final LayerNorm and an untied, bias-free
`lm_head`. Counts here must equal the real sharded model's parameters exactly,
rank by rank, so every sharding rule below mirrors the implementation:

- tensor parallel (Megatron): `tok_emb` is vocab-parallel (rows split, vocab padded
  up to a multiple of tp), `pos_emb` replicated; q, k, v and `mlp.fc` are
  column-parallel (weight rows and bias split); `attn.proj` and `mlp.proj` are
  row-parallel (weight columns split, bias replicated); LayerNorms replicated;
  `lm_head` column-parallel over the padded vocab.
- pipeline parallel: stage 0 holds the embeddings, the last stage holds `ln_f` and
  `lm_head`; blocks are split by a balance list.
- BERT (a BertConfig; the same blocks): stage 0 also holds the segment embedding; the
  last stage holds `ln_f` and the MLM head (dense d×d, LayerNorm, a vocab-parallel bias)
  tied to `tok_emb`, and a copy of the `tok_emb` shard when it is not stage 0.
"""
from minitensor.models.bert import BertConfig
from minitensor.models.gpt import GPTConfig  # the planner reasons about the very model it plans for

from ..tensor_parallel.sharding import padded_size  # the very padding rule the model uses

# Named configs with the global batch (in sequences) each is usually trained with.
CONFIGS = {
    "small": GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, d_model=128),
    "medium": GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512),
    "gpt2-124m": GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, d_model=768),
    "gpt2-xl": GPTConfig(vocab_size=50257, block_size=1024, n_layer=48, n_head=25, d_model=1600),
    "gpt3-175b": GPTConfig(vocab_size=50257, block_size=2048, n_layer=96, n_head=96, d_model=12288),
}
DEFAULT_BATCH = {"small": 16, "medium": 8, "gpt2-124m": 512, "gpt2-xl": 512, "gpt3-175b": 1536}


def get_config(name):
    if name not in CONFIGS:
        raise ValueError(f"unknown config {name!r}; known: {', '.join(CONFIGS)}")
    return CONFIGS[name]


def check_tp(config, tp):
    if config.n_head % tp or (4 * config.d_model) % tp:
        raise ValueError(
            f"tp={tp} must divide n_head={config.n_head} and 4*d_model={4 * config.d_model}")


def balanced_partition(n_layer, pp):
    """Blocks per stage, as even as possible; earlier stages take the extra block."""
    base, extra = balanced_split(n_layer, pp)
    return [base + (stage < extra) for stage in range(pp)]


def balanced_split(n_layer, pp):
    """(blocks of every stage, how many first stages hold one more)."""
    if not 1 <= pp <= n_layer:
        raise ValueError(f"pp={pp} must be between 1 and n_layer={n_layer}")
    return divmod(n_layer, pp)


def stage_layers(n_layer, pp, balance=None):
    """The balance list to use: the given one (checked) or the balanced default."""
    if balance is None:
        return balanced_partition(n_layer, pp)
    balance = list(balance)
    if len(balance) != pp or sum(balance) != n_layer or min(balance) < 1:
        raise ValueError(f"balance={balance} must be {pp} positive counts summing to n_layer={n_layer}")
    return balance


def block_param_count(d_model, tp=1):
    """Parameters of one transformer block on one tensor-parallel rank.

    Dense (tp=1): 12 d² + 13 d.
    """
    d = d_model
    mlp_fc = (4 * d * d + 4 * d) // tp              # column-parallel
    mlp_proj = 4 * d * d // tp + d                  # row-parallel
    return attention_param_count(d, tp) + mlp_fc + mlp_proj


def attention_param_count(d, tp=1):
    """A block's parameters besides its MLP, on one tp rank: the LayerNorms and attention."""
    layer_norms = 2 * (2 * d)                       # ln_1, ln_2: weight + bias, replicated
    qkv = 3 * (d * d + d) // tp                     # column-parallel: rows and bias split
    attn_proj = d * d // tp + d                     # row-parallel: columns split, bias whole
    return layer_norms + qkv + attn_proj


def has_experts(config):
    """Whether the model has mixture-of-experts blocks at all (a BERT config has no n_experts)."""
    return bool(getattr(config, "n_experts", 0))


def is_moe_block(config, index):
    """Whether block `index` of the model has a mixture-of-experts MLP."""
    return has_experts(config) and config.is_moe(index)


def expert_param_count(config, width=None):
    """One expert MLP: fc (d·f + f) and proj (f·d + d), f = config.expert_width (fine-grained:
    its own setting; default the MLP's) or `width`."""
    d, f = config.d_model, width or config.expert_width
    return 2 * d * f + f + d


def shared_expert_param_count(config):
    """The shared experts, held as one MLP of S × the expert width (0 without them)."""
    return expert_param_count(config, config.shared_experts * config.expert_width) if config.shared_experts else 0


def moe_block_param_count(config, tp=1, ep=1):
    """A mixture-of-experts block on one rank: LayerNorms and attention as in a dense block;
    the router (d·E, no bias), the shared experts (replicated like the router) and this ep
    rank's E/ep experts, whole on every tp rank."""
    return (attention_param_count(config.d_model, tp) + config.d_model * config.n_experts
            + shared_expert_param_count(config) + config.n_experts // ep * expert_param_count(config))


def stage_blocks(config, pp, stage, balance=None):
    """The global indices of the blocks pipeline `stage` holds."""
    if balance is None:  # balanced_partition's stage, without building the list (the search asks often)
        base, extra = balanced_split(config.n_layer, pp)
        first = stage * base + min(stage, extra)
        return range(first, first + base + (stage < extra))
    layers = stage_layers(config.n_layer, pp, balance)
    first = sum(layers[:stage])
    return range(first, first + layers[stage])


def routing_bias_bytes(config, pp=1, stage=0, balance=None):
    """The float32 routing bias (loss-free balancing: E per MoE block) a rank at pipeline `stage` holds."""
    return moe_blocks(config, stage_blocks(config, pp, stage, balance)) * config.n_experts * 4 if has_experts(config) else 0


def moe_blocks(config, blocks):
    """How many of the blocks (global indices) have a mixture-of-experts MLP."""
    if not has_experts(config):  # a dense model: the planner's search asks for every layout and stage
        return 0
    return sum(config.is_moe(i) for i in blocks)


def expert_params_on_stage(config, pp=1, stage=0, balance=None, ep=1):
    """Expert parameters one rank holds at `stage`: its E/ep experts of each MoE block there."""
    moe = moe_blocks(config, stage_blocks(config, pp, stage, balance))
    return moe * config.n_experts // ep * expert_param_count(config) if moe else 0


def unit_param_counts(config, tp=1, pp=1, stage=0, balance=None, ep=1):
    """Parameters of each ZeRO-2/3 unit one rank holds at pipeline `stage`, in forward
    order: tok_emb shard, pos_emb (stage 0), each block, ln_f, lm_head shard (last stage);
    a BERT's seg_emb first, its MLM head and (with pp > 1) tok_emb's copy last. A mixture
    of experts' blocks hold E/ep experts each (moe_block_param_count)."""
    check_tp(config, tp)
    if not 0 <= stage < pp:
        raise ValueError(f"stage={stage} out of range for pp={pp}")
    d, vocab = config.d_model, padded_size(config.vocab_size, tp)
    bert = isinstance(config, BertConfig)
    first = [vocab // tp * d, config.block_size * d] if stage == 0 else []  # tok_emb shard, pos_emb
    first += [config.n_segments * d] if stage == 0 and bert else []       # BERT: seg_emb
    last = [2 * d, vocab // tp * d] if stage == pp - 1 else []            # ln_f, lm_head shard
    if stage == pp - 1 and bert:  # ln_f, MLM head (dense, LayerNorm, bias shard), the tied tok_emb's copy
        last = [2 * d, d * d + 3 * d + vocab // tp] + ([vocab // tp * d] if pp > 1 else [])
    dense, blocks = block_param_count(d, tp), stage_blocks(config, pp, stage, balance)
    if not has_experts(config):  # the planner's search asks this for every layout and stage
        return first + [dense] * len(blocks) + last
    moe = moe_block_param_count(config, tp, ep)
    return first + [moe if config.is_moe(i) else dense for i in blocks] + last


def unit_replica_counts(config, tp=1, pp=1, stage=0, balance=None, ep=1):
    """[(parameters replicated over dp × cp, parameters replicated over edp)] of each ZeRO-2/3
    unit (unit_param_counts): under expert parallelism a MoE block's E/ep experts have their
    own replicas (parallel.hybrid.sections); with ep = 1 they are the dense ones'."""
    units = unit_param_counts(config, tp, pp, stage, balance, ep)
    if ep == 1 or not has_experts(config):
        return [(unit, 0) for unit in units]
    experts, first = config.n_experts // ep * expert_param_count(config), 2 + isinstance(config, BertConfig)
    moe = [False] * (first if stage == 0 else 0) + [config.is_moe(i) for i in stage_blocks(config, pp, stage, balance)]
    moe += [False] * (len(units) - len(moe))
    return [(unit - experts, experts) if is_moe else (unit, 0) for unit, is_moe in zip(units, moe)]


def param_count(config, tp=1, pp=1, stage=0, balance=None, ep=1):
    """Parameters held by one rank at pipeline `stage` of a tp × pp (× ep) model (any dp)."""
    return sum(unit_param_counts(config, tp, pp, stage, balance, ep))


def dense_param_count(config):
    """All parameters of the single-device model (a GPT's embeddings untied, a BERT's tied)."""
    return param_count(config)


def matmul_weight_count(config):
    """Weights that multiply activations (every block Linear and lm_head): the N in 6·N·T."""
    return config.n_layer * 12 * config.d_model ** 2 + config.vocab_size * config.d_model
