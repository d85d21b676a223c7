"""Tensor parallelism (Megatron-LM) and sequence parallelism (Korthikanti et al.).

    mappings.py     the conjugate communication ops (f, g, gather/split, sequence pair)
    sharding.py     slicing dense tensors into shards and gathering them back
    layers.py       ColumnParallelLinear, RowParallelLinear
    vocab.py        VocabParallelEmbedding, vocab_parallel_cross_entropy (vocabulary padding)
    transformer.py  ParallelSelfAttention, ParallelMLP, ParallelBlock
    random.py       dropout streams: replicated vs sharded regions
    mlm_head.py     ParallelMLMHead: BERT's output layer on the vocab-parallel tied embedding
    model.py        TensorParallelStage: a dense GPTSlice (or the whole GPT) converted part by part
"""
from .layers import ColumnParallelLinear, RowParallelLinear, TensorParallelModule
from .mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from .mlm_head import ParallelMLMHead
from .model import TensorParallelGPT, TensorParallelStage
from .random import TensorParallelRNG
from .sharding import all_reduce_partial_grads, full_grads, full_state_dict, load_full_state_dict
from .transformer import ParallelBlock, ParallelMLP, ParallelSelfAttention
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "TensorParallelModule",
    "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "TensorParallelGPT", "TensorParallelStage", "TensorParallelRNG",
    "full_state_dict", "full_grads", "load_full_state_dict", "all_reduce_partial_grads",
    "ParallelSelfAttention", "ParallelMLP", "ParallelBlock", "ParallelMLMHead",
    "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
]
