"""The operator graph the search reads for a model config: one traced transformer block."""
import numpy as np

import minitensor as mt
from minitensor.graph import trace
from minitensor.models import gpt
from minitensor.tensor import Tensor


def block_graph(config, micro_batch, dtype=np.float32):
    """The ir.Graph of one GPT block of `config` (a planner GPTConfig) on a (micro_batch,
    block_size, d_model) input: what minitensor.graph.trace records when the block runs."""
    mt.manual_seed(0)
    block = gpt.Block(config, dtype=dtype)  # the planner's GPTConfig is the model's
    x = np.random.default_rng(0).standard_normal((micro_batch, config.block_size, config.d_model)).astype(dtype)
    return trace(block, Tensor(x)).graph
