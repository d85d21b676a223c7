"""parallel: data, tensor and pipeline parallelism over MPI ranks or threads."""
from .launch import limit_blas_threads

limit_blas_threads()  # must run before numpy is imported below

from .comm import Group, run_threads, world  # noqa: E402
from .data_parallel import DataParallel, FullyShardedDataParallel, ZeroOptimizer  # noqa: E402
from .hybrid import HybridGPT  # noqa: E402
from .mesh import Mesh  # noqa: E402
from .pipeline import Pipeline  # noqa: E402
from .tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    ParallelBlock,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    TensorParallelGPT,
    TensorParallelStage,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

__all__ = ["Group", "run_threads", "world", "Mesh"]
__all__ += ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention", "ParallelBlock",
            "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "TensorParallelGPT", "TensorParallelStage"]
__all__ += ["DataParallel", "ZeroOptimizer", "FullyShardedDataParallel"]
__all__ += ["Pipeline"]
__all__ += ["HybridGPT"]
