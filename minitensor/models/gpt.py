"""A GPT-2-style transformer, readable top to bottom: the single-device reference that
every parallel layout is checked against.

    idx ─▶ tok_emb + pos_emb ─▶ dropout ─▶ n_layer × Block ─▶ ln_f ─▶ lm_head ─▶ logits
    Block:  x = x + attn(ln_1(x));   x = x + mlp(ln_2(x))            (pre-LayerNorm)

Parameter names (`blocks.0.attn.q.weight`, ...) are the public checkpoint format.

With n_experts = E > 0 every moe_every-th block's MLP is a mixture of E expert MLPs
(minitensor.nn.moe: `blocks.1.mlp.router.weight`, `blocks.1.mlp.experts.3.fc.weight`, ...)
and the loss gains their balancing and z-losses. E = 0 is the dense GPT, unchanged.
"""
import math
from dataclasses import dataclass

import numpy as np

from minitensor import nn
from minitensor.autograd import no_grad
from minitensor.nn import functional as F
from minitensor.nn.attention_kernels import DENSE
from minitensor.nn.moe import MoE, check_routing
from minitensor.nn.moe_device_limit import check_device_limit
from minitensor.random import default_generator
from minitensor.tensor import DEFAULT_FLOAT, Tensor


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    d_model: int
    dropout: float = 0.0
    causal: bool = True
    d_head: int = None  # width of one head; default d_model // n_head (structured pruning keeps it)
    d_ff: int = None    # the MLP's hidden width; default 4·d_model (structured pruning shrinks it)
    n_experts: int = 0  # E > 0: mixture-of-experts MLPs (each of width mlp_width) in every moe_every-th block
    top_k: int = 2      # experts per token
    moe_every: int = 1  # blocks moe_every-1, 2·moe_every-1, ... are MoE
    capacity_factor: float = None  # None: dropless; C: at most ⌈C·T·k/E⌉ tokens per expert and sequence
    aux_loss_coef: float = 0.01    # the Switch balancing loss's α
    aux_loss_scope: str = "sequence"  # its token group: one "sequence" (DeepSeek-V3) or the micro-"batch" (Switch)
    z_loss_coef: float = 0.0       # the ST-MoE router z-loss's β
    renormalize: bool = True       # the top-k gates divided by their sum (Mixtral), or not (Switch)
    expert_hidden: int = None      # an expert's hidden width (fine-grained experts); default mlp_width
    shared_experts: int = 0        # experts every token runs beside its routed ones (DeepSeekMoE)
    router_score: str = "softmax"  # or "sigmoid" (DeepSeek-V3): the gates normalised over the chosen
    expert_bias_rate: float = 0.0  # γ of auxiliary-loss-free balancing (0: no bias)
    expert_groups: int = 1         # G groups of E/G experts (ep's ranks) for device-limited routing
    max_groups_per_token: int = None  # M: a token's experts in at most M groups (None: G, no limit)
    name = "GPT"  # (a class attribute, not a field) for messages

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {value!r}")
        for name in ("d_head", "d_ff"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"GPTConfig: {name} must be a positive integer or None, got {value!r}")
        if self.d_head is None and self.d_model % self.n_head:
            raise ValueError(f"GPTConfig: d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.n_experts:
            self.check_experts()

    def check_experts(self):
        if not isinstance(self.n_experts, (int, np.integer)) or self.n_experts < 0:
            raise ValueError(f"GPTConfig: n_experts must be a non-negative integer, got {self.n_experts!r}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"GPTConfig: top_k={self.top_k} must be in [1, n_experts={self.n_experts}]")
        if not isinstance(self.moe_every, (int, np.integer)) or not 1 <= self.moe_every <= self.n_layer:
            raise ValueError(f"GPTConfig: moe_every={self.moe_every!r} must be in [1, n_layer={self.n_layer}] "
                             f"(blocks moe_every-1, 2·moe_every-1, ... are MoE: a larger one places none)")
        if self.capacity_factor is not None and not 0 < self.capacity_factor < math.inf:
            raise ValueError(f"GPTConfig: capacity_factor={self.capacity_factor} must be None (dropless) or a "
                             f"finite number > 0")
        if self.expert_hidden is not None and (not isinstance(self.expert_hidden, (int, np.integer))
                                               or self.expert_hidden < 1):
            raise ValueError(f"GPTConfig: expert_hidden must be a positive integer or None, got {self.expert_hidden!r}")
        if not isinstance(self.shared_experts, (int, np.integer)) or self.shared_experts < 0:
            raise ValueError(f"GPTConfig: shared_experts must be a non-negative integer, got {self.shared_experts!r}")
        check_routing(self.n_experts, self.top_k, self.renormalize, self.router_score, self.aux_loss_scope)
        check_device_limit(self.n_experts, self.top_k, self.expert_groups, self.max_groups_per_token or self.expert_groups)
        if not self.expert_bias_rate >= 0:
            raise ValueError(f"GPTConfig: expert_bias_rate={self.expert_bias_rate} must be ≥ 0")
        if self.aux_loss_coef < 0 or self.z_loss_coef < 0:
            raise ValueError(f"GPTConfig: aux_loss_coef={self.aux_loss_coef} and z_loss_coef={self.z_loss_coef} "
                             f"must be ≥ 0")

    def is_moe(self, layer):
        """Whether block `layer`'s MLP is a mixture of experts."""
        return self.n_experts > 0 and layer % self.moe_every == self.moe_every - 1

    @property
    def head_dim(self):
        return self.d_head or self.d_model // self.n_head

    @property
    def mlp_width(self):
        return self.d_ff or 4 * self.d_model

    @property
    def expert_width(self):
        return self.expert_hidden or self.mlp_width


def split_heads(x, n_head):
    """(B, T, n_head·d) → (B, n_head, T, d)."""
    b, t, c = x.shape
    return x.reshape(b, t, n_head, c // n_head).transpose(1, 2)


def merge_heads(x):
    """(B, n_head, T, d) → (B, T, n_head·d)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def attend(q, k, v, n_head, causal, dropout_p, training, kernel=DENSE):
    """Multi-head attention on projected q, k, v of shape (B, T, n_head·d), by `kernel`
    (minitensor.nn.attention_kernels: dense, or flash's tiles)."""
    heads = kernel(split_heads(q, n_head), split_heads(k, n_head), split_heads(v, n_head),
                   causal=causal, dropout_p=dropout_p, training=training)
    return merge_heads(heads)


def use_attention(model, kernel):
    """Compute every SelfAttention of `model` (a GPT, a BERT, or any module holding their blocks)
    with `kernel`: the same function, another way (flash attention keeps O(T·d) bytes, not O(T²)).
    Do it before a parallel layout converts the model: the layout copies each block's kernel."""
    layers = [m for m in model.modules() if isinstance(m, SelfAttention)]
    if not kernel.has_dropout and any(layer.dropout for layer in layers):
        raise ValueError(f"{kernel.name} attention has no dropout on its probabilities, but the model's dropout is "
                         f"{layers[0].dropout}; use dropout 0 or the dense kernel")
    for layer in layers:
        layer.kernel = kernel
    return model


class SelfAttention(nn.Module):
    def __init__(self, config, dtype=DEFAULT_FLOAT):
        super().__init__()
        d, inner = config.d_model, config.n_head * config.head_dim
        self.n_head, self.causal, self.dropout = config.n_head, config.causal, config.dropout
        self.kernel = DENSE  # how attention is computed (use_attention)
        self.q, self.k, self.v = (nn.Linear(d, inner, dtype=dtype) for _ in range(3))
        self.proj = nn.Linear(inner, d, dtype=dtype)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x):
        y = attend(self.q(x), self.k(x), self.v(x), self.n_head, self.causal, self.dropout, self.training,
                   self.kernel)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config, dtype=DEFAULT_FLOAT):
        super().__init__()
        d = config.d_model
        self.fc = nn.Linear(d, config.mlp_width, dtype=dtype)
        self.proj = nn.Linear(config.mlp_width, d, dtype=dtype)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config, dtype=DEFAULT_FLOAT, layer=0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, dtype=dtype)
        self.attn = SelfAttention(config, dtype)
        self.ln_2 = nn.LayerNorm(config.d_model, dtype=dtype)
        self.mlp = moe_of(config, dtype) if config.is_moe(layer) else MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def moe_of(config, dtype):
    return MoE(config.d_model, config.expert_width, config.n_experts, config.top_k, config.renormalize,
               config.capacity_factor, config.aux_loss_coef, config.z_loss_coef, config.dropout, dtype,
               shared_experts=config.shared_experts, router_score=config.router_score,
               expert_bias_rate=config.expert_bias_rate, expert_groups=config.expert_groups,
               max_groups_per_token=config.max_groups_per_token, aux_loss_scope=config.aux_loss_scope)


def moe_loss(blocks, dtype=None):
    """The sum of the MoE blocks' balancing and z-losses of the last forward (in `dtype`: the
    loss's, float32 where the blocks compute in 16 bits)."""
    total = sum(block.mlp.aux_loss for block in blocks if isinstance(block.mlp, MoE))
    return total if dtype is None or total.dtype == dtype else total.to(dtype)


class GPTEnds:
    """The two ends of a GPT or a BERT, for any module that holds its parts under the model's
    names: `embed` (tok_emb, pos_emb, BERT's seg_emb, drop) and `head` (ln_f, then the GPT's
    lm_head or BERT's mlm_head on the tied tok_emb weight; the loss). Both models and every
    slice of them (slice.py) inherit them; a tensor-parallel slice overrides only `positions`
    (its slice of the sequence) and `loss` (over a vocabulary split in shards)."""

    first_parts = ("tok_emb", "pos_emb", "drop")  # what the first slice holds (slice.py)
    last_parts = ("ln_f", "lm_head")              # and the last (bert.py: + the tied tok_emb)
    tied_reads = {}  # part -> the tied parts its forward reads besides its own (bert.py: the MLM head)

    def embed(self, idx):
        """Token + position (+ segment) embeddings of integer `idx` (B, T), then dropout."""
        idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
        t = idx.shape[-1]
        if t > self.config.block_size:
            raise ValueError(f"{self.config.name}: sequence length {t} exceeds block_size {self.config.block_size}")
        positions = self.positions(t)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        if "seg_emb" in self._modules:  # BERT: the segment of each of these positions
            x = x + self.seg_emb(self.config.segment_ids(idx)[..., positions])
        return self.drop(x)

    def positions(self, t):
        """The positions whose embeddings are added: all of 0 .. t-1."""
        return np.arange(t)

    def head(self, x, targets=None):
        """Final LayerNorm and the output layer; with targets, also the mean cross-entropy."""
        x = self.ln_f(x)
        logits = self.mlm_head(x, self.tok_emb.weight) if "mlm_head" in self._modules else self.lm_head(x)
        return logits, (self.loss(logits, targets) if targets is not None else None)

    def loss(self, logits, targets):
        return F.cross_entropy(logits, targets)


def init_weights(model, n_layer):
    """GPT-2 init: N(0, 0.02) weights, zero biases, LayerNorms (1, 0), residual projections
    scaled by 1/√(2·n_layer) so the residual stream's variance does not grow with depth."""
    rng = default_generator()
    norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, p in model.named_parameters():
        if id(p) in norms:
            continue
        if name.endswith("bias"):
            p.data[...] = 0
        elif name.endswith("weight"):
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
            p.data[...] = rng.standard_normal(p.shape) * std


class GPT(GPTEnds, nn.Module):
    def __init__(self, config, dtype=DEFAULT_FLOAT):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model, dtype=dtype)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model, dtype=dtype)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, dtype, layer) for layer in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, dtype=dtype)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self):
        init_weights(self, self.config.n_layer)

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits, loss = self.head(x, targets)
        if loss is not None and self.config.n_experts:
            loss = loss + moe_loss(self.blocks, loss.dtype)
        return logits, loss

    @no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        """Extend `idx` (B, T) by sampling one token at a time from the model."""
        rng = generator if generator is not None else default_generator()
        idx = np.asarray(idx)
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            last = logits.data[:, -1, :].astype(np.float64) / max(temperature, 1e-8)
            if greedy:
                nxt = last.argmax(axis=-1)
            else:
                p = np.exp(last - last.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
                nxt = np.array([rng.choice(len(row), p=row) for row in p])
            idx = np.concatenate([idx, nxt[:, None]], axis=1)
        return idx
