"""Attention kernels: interchangeable ways to compute softmax(s·Q Kᵀ) V, one contract.

    kernel(q, k, v, causal, dropout_p, training)   the output, for (B, heads, T, d) tensors
    kernel.tiles                                    (B_r, B_c) a block of queries × keys is computed in
                                                    by ring attention, or None: the whole block at once

    DenseAttention   MatMul → Softmax → MatMul (F.scaled_dot_product_attention): keeps the
                     (T × T) probabilities of every head for backward
    FlashAttention   the tiled kernel (minitensor/nn/flash_attention.py): keeps O and L only

A model holds one (SelfAttention.kernel, set by minitensor.models.gpt.use_attention), and
every layout runs it: tensor parallelism on the rank's heads, a pipeline stage on its
blocks, context parallelism on each block pair of the ring (through `tiles`).
"""
from dataclasses import dataclass

from minitensor.nn import functional as F
from minitensor.nn.flash_attention import flash_attention

KERNELS = ("dense", "flash")


@dataclass(frozen=True)
class DenseAttention:
    name = "dense"
    tiles = None
    has_dropout = True

    def __call__(self, q, k, v, causal, dropout_p=0.0, training=False):
        return F.scaled_dot_product_attention(q, k, v, causal=causal, dropout_p=dropout_p, training=training)


@dataclass(frozen=True)
class FlashAttention:
    block_q: int = 64
    block_k: int = 64
    name = "flash"
    has_dropout = False  # dropout on the probabilities would need them kept, or their random mask regenerated

    @property
    def tiles(self):
        return self.block_q, self.block_k

    def __call__(self, q, k, v, causal, dropout_p=0.0, training=False):
        if dropout_p and training:
            raise ValueError(f"flash attention has no dropout on its probabilities (dropout {dropout_p}); "
                             f"use dropout 0 or the dense kernel")
        return flash_attention(q, k, v, causal=causal, block_q=self.block_q, block_k=self.block_k)


DENSE = DenseAttention()


def attention_kernel(name, block=64):
    """The kernel called `name` ("dense" or "flash"; flash in tiles of block × block)."""
    if name not in KERNELS:
        raise ValueError(f"attention kernel {name!r} is not one of {KERNELS}")
    if name == "dense":
        return DENSE
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"flash attention: block size must be a positive integer, got {block!r}")
    return FlashAttention(block, block)
