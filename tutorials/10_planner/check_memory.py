"""Chapter 10, part 2: the planner's parameter count per rank against the real sharded model.

    python tutorials/10_planner/check_memory.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/10_planner/check_memory.py

Builds the "small" GPT two ways over this run's ranks — tensor parallel (tp = ranks)
and pipeline parallel (pp = ranks) — and prints, rank by rank, the parameter bytes
the planner predicts (parallel.plan.param_bytes_per_rank) next to the bytes the real
model holds, then the planner's activation estimate next to the measured bytes the
pipeline stages kept (a different, model-specific count: the two are printed, not equated).
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from parallel import Pipeline, TensorParallelGPT
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.plan import Layout, activation_bytes_per_rank, get_config, param_bytes_per_rank

PLAN_CONFIG = get_config("small")
CONFIG = GPTConfig(**{f: getattr(PLAN_CONFIG, f) for f in ("vocab_size", "block_size", "n_layer", "n_head",
                                                          "d_model")})
BATCH, M = 8, 2


def held_bytes(parameters):
    return sum(p.data.nbytes for p in parameters)


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    n = group.size
    say(f"the 'small' GPT {CONFIG.n_layer} blocks, d_model {CONFIG.d_model}, vocab {CONFIG.vocab_size}, "
        f"float32, on {n} rank(s)")

    mt.manual_seed(0)
    tp_model = TensorParallelGPT(GPT(CONFIG), group)
    predicted = param_bytes_per_rank(PLAN_CONFIG, 1, n, 1, (0, group.rank, 0))["params"]
    rows = group.all_gather(np.array([[predicted, held_bytes(tp_model.parameters())]], dtype=np.int64))
    say(f"\ntensor parallel, tp = {n}: parameter bytes per rank")
    for rank, (plan_bytes, real) in enumerate(rows):
        say(f"  tp rank {rank}: planner {plan_bytes:>8}  real model {real:>8}  difference {real - plan_bytes}")

    predictions = {"tensor parallel: parameter bytes": rows}  # (planner, real) pairs, for tutorials/pictures/
    if n > CONFIG.n_layer:
        say(f"\n(pipeline part skipped: {n} stages need at least {n} blocks)")
        return predictions
    mt.manual_seed(0)
    pipe = Pipeline.from_gpt(GPT(CONFIG), group, microbatches=M, schedule="1f1b")
    predicted = param_bytes_per_rank(PLAN_CONFIG, 1, 1, n, (0, 0, group.rank))["params"]
    rng = np.random.default_rng(0)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size)) for _ in range(2))
    pipe.train_step(idx, targets)
    layout = Layout(pp=n, micro_batches=M)
    planned_act = activation_bytes_per_rank(PLAN_CONFIG, layout, BATCH // M, group.rank)
    rows = group.all_gather(np.array([[predicted, held_bytes(pipe.parameters()), planned_act,
                                       pipe.peak_activation_bytes]], dtype=np.int64))
    say(f"\npipeline parallel, pp = {n}, 1F1B, m = {M}: bytes per stage")
    for rank, (plan_bytes, real, plan_act, real_act) in enumerate(rows):
        say(f"  stage {rank}: parameters planner {plan_bytes:>8}  real model {real:>8}  difference {real - plan_bytes}"
            f";  activations planner {plan_act:>8}  measured {real_act:>8}")
    predictions["pipeline: parameter bytes"] = rows[:, :2]
    predictions["pipeline: activation bytes"] = rows[:, 2:]
    return predictions


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
