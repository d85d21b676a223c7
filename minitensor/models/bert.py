"""A BERT-style encoder from the GPT's own blocks: the bidirectional half of the family.

    idx ─▶ tok_emb + pos_emb + seg_emb ─▶ dropout ─▶ n_layer × Block (no causal mask) ─▶ ln_f
        ─▶ mlm_head: dense ─▶ GELU ─▶ LayerNorm ─▶ · tok_embᵀ + bias ─▶ logits over the vocabulary

What differs from the GPT, and nothing else:
- attention sees the whole sequence (`causal=False` in the same `Block`);
- a segment embedding says which of two sentences a position belongs to. The segments
  are derived from the input itself: a position is in segment 1 after the first separator
  token `sep_id` (BERT's [SEP]). Separators are never masked or drawn as replacements
  (`data.mlm`), so the input stays one (B, T) array of ids and every parallel layer,
  pipeline message and dp split of the GPT carries a BERT unchanged;
- the output layer is tied to the token embedding (one parameter) behind a small
  transform, and the loss counts the masked positions only (labels -100 elsewhere).

Pre-LayerNorm, as the GPT here (x + f(LN(x)) and a final ln_f), not the original BERT's
post-LN (LN(x + f(x)), and a LayerNorm on the embeddings). Pre-LN trains stably without
BERT's long learning-rate warm-up (Xiong et al. 2020) and, above all, keeps the blocks
identical to the GPT's: the tensor-parallel, pipeline and pruning code is the same code.
"""
from dataclasses import dataclass

import numpy as np

from minitensor import nn
from minitensor.models.gpt import Block, GPTConfig, GPTEnds, init_weights
from minitensor.nn import functional as F
from minitensor.tensor import DEFAULT_FLOAT


@dataclass(frozen=True)
class BertConfig(GPTConfig):
    """GPTConfig's sizes, bidirectional, with `n_segments` segments split at the token `sep_id`."""
    causal: bool = False
    n_segments: int = 2
    sep_id: int = 0
    name = "BERT"

    def __post_init__(self):
        super().__post_init__()
        if self.causal:
            raise ValueError("BertConfig: an encoder attends both ways; causal must be False")
        if not 0 <= self.sep_id < self.vocab_size:
            raise ValueError(f"BertConfig: sep_id={self.sep_id} outside the vocabulary [0, {self.vocab_size})")
        if self.n_segments < 1:
            raise ValueError(f"BertConfig: n_segments must be ≥ 1, got {self.n_segments}")

    def segment_ids(self, idx):
        """(B, T) ids → segment of each position: the number of separators before it (capped)."""
        sep = idx == self.sep_id
        return np.minimum(np.cumsum(sep, axis=-1) - sep, self.n_segments - 1)


class MLMHead(nn.Module):
    """The masked-LM output layer: logits = LN(gelu(dense(x))) Eᵀ + bias, where E is the token
    embedding's weight, passed in (the tied parameter lives in tok_emb only)."""

    def __init__(self, config, dtype=DEFAULT_FLOAT):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model, dtype=dtype)
        self.norm = nn.LayerNorm(config.d_model, dtype=dtype)
        self.bias = nn.Parameter(np.zeros(config.vocab_size, dtype=dtype))

    def transform(self, x):
        return self.norm(F.gelu(self.dense(x), approximate="tanh"))

    def forward(self, x, embedding_weight):
        return F.linear(self.transform(x), embedding_weight, self.bias)


class BERT(GPTEnds, nn.Module):
    """`model(idx, targets=None) -> (logits, mean MLM loss over the labelled positions or None)`."""

    first_parts = ("tok_emb", "pos_emb", "seg_emb", "drop")
    last_parts = ("ln_f", "mlm_head", "tok_emb")  # the head reads the tied embedding
    tied_reads = {"mlm_head": ("tok_emb",)}  # its weight, passed in by head()

    def __init__(self, config, dtype=DEFAULT_FLOAT):
        if not isinstance(config, BertConfig):
            raise TypeError(f"BERT needs a BertConfig, got {type(config).__name__}")
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model, dtype=dtype)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model, dtype=dtype)
        self.seg_emb = nn.Embedding(config.n_segments, config.d_model, dtype=dtype)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, dtype) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, dtype=dtype)
        self.mlm_head = MLMHead(config, dtype)
        init_weights(self, config.n_layer)

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)
