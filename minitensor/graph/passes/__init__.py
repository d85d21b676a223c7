"""Graph rewrites: each pass is a function Graph → Graph that keeps every output and
gradient (to round-off), with its algebraic identity in its module's docstring.

    gm2 = gm.transform(*DEFAULT_PASSES)       # or gm.transform(fuse_qkv, ...)

Passes that fuse create these ops: "BiasGelu" (bias_gelu.py); the others rewrite into
the engine's own ops (Concat, Linear, GetItem, Softmax with scale and mask, Permute, MatMul).
"""
from minitensor.graph.passes.bias_gelu import BiasGelu, fuse_bias_gelu
from minitensor.graph.passes.cse import eliminate_common_subexpressions
from minitensor.graph.passes.dce import eliminate_dead_nodes
from minitensor.graph.passes.qkv import fuse_qkv
from minitensor.graph.passes.softmax_chain import fuse_softmax_chain
from minitensor.graph.passes.transpose import eliminate_transposes

# The order they run in by default: merge repeats first (so fusions see one copy), then
# the fusions, then sweep what they left dead.
DEFAULT_PASSES = (eliminate_common_subexpressions, eliminate_transposes, fuse_qkv, fuse_bias_gelu,
                  fuse_softmax_chain, eliminate_dead_nodes)

__all__ = ["DEFAULT_PASSES", "BiasGelu", "eliminate_common_subexpressions", "eliminate_dead_nodes",
           "eliminate_transposes", "fuse_bias_gelu", "fuse_qkv", "fuse_softmax_chain"]
