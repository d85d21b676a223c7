"""`python -m parallel.bench precision`: step time and bytes per rank under fp32, fp16, bf16 and
the FP8 recipes (fp8-current, fp8-delayed, fp8-blockwise: minitensor.fp8; fp8-current all-reduces
an amax per cast, which a --dp run shows).

On a CPU this shows memory, not speed. numpy has no fast 16-bit arithmetic: its float16
GEMM runs without BLAS, and its float32 ↔ float16 conversion and float16 elementwise
ops are scalar loops, so minitensor multiplies 16-bit matrices in float32 BLAS
(minitensor.dtypes) and pays a conversion on every GEMM; bfloat16 (ml_dtypes) converts
faster. The FP8 products are emulated the same way: the operands are scaled, cast to FP8
(ml_dtypes) and multiplied in float32 BLAS, tile by tile for the blockwise recipe, so here
they cost time that an H100's FP8 tensor cores would save (the planner's h100 profile models
that). The first table measures those GEMMs; the second, one training step of the GPT.
"""
import numpy as np

import minitensor as mt
from minitensor import dtypes
from minitensor.amp import precision_policy
from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import median_seconds
from minitensor.fp8.gemm import scaled_matmul
from minitensor.fp8.recipe import Fp8Recipe
from minitensor.models.gpt import GPT, GPTConfig

from ..comm import run_threads
from ..hybrid import HybridGPT
from ..mesh import Mesh
from ..plan.memory import param_bytes_per_rank
from ..plan.validate_worker import measure_memory


def gemm_table(n, repeats):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    rows = [("float32 BLAS", median_seconds(lambda: a @ b, repeats))]
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    rows.append(("float16, numpy's own matmul", median_seconds(lambda: a16 @ b16, max(1, repeats // 5))))
    rows.append(("float16 via float32 BLAS (minitensor)", median_seconds(lambda: dtypes.matmul(a16, b16), repeats)))
    if dtypes.bfloat16 is not None:
        a_bf, b_bf = a.astype(dtypes.bfloat16), b.astype(dtypes.bfloat16)
        rows.append(("bfloat16 via float32 BLAS (minitensor)",
                     median_seconds(lambda: dtypes.matmul(a_bf, b_bf), repeats)))
    for name, recipe in (("FP8 per tensor: cast, scaled float32 BLAS", Fp8Recipe("current")),
                         ("FP8 1x128 tiles, 128x128 blocks", Fp8Recipe("blockwise"))):
        layer = recipe.layer()
        rows.append((name, median_seconds(lambda: scaled_matmul(*layer.forward_operands(a, b)[:2], np.float32),
                                          repeats)))
    base = rows[0][1]
    lines = [f"GEMM {n}x{n} @ {n}x{n}, median of {repeats}:", f"  {'':<40}{'ms':>9}{'vs fp32':>9}"]
    lines += [f"  {name:<40}{t * 1e3:>9.2f}{t / base:>8.1f}x" for name, t in rows]
    return "\n".join(lines)


def step_row(precision, config, dp, batch, steps):
    """(median step seconds, measured {params, grads, optim} of rank 0, planner formula) on dp threads."""
    def rank():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config), Mesh(dp, 1, 1), precision=precision)
        model.configure_optimizer()
        idx = np.random.default_rng(0).integers(0, config.vocab_size, (batch, config.block_size))
        memory = {}

        def step():
            model.train_step(idx, np.roll(idx, -1, axis=1))
            model.finish_grad_sync()
            memory.update(measure_memory(model))
            model.optimizer_step()

        return median_seconds(step, steps), memory  # after one untimed step
    seconds, memory = run_threads(dp, rank)[0]
    formula = param_bytes_per_rank(config, dp, 1, 1, dtype=precision)
    return seconds, memory, formula


def main(argv=None):
    parser = bench_parser("python -m parallel.bench precision", __doc__, steps=5)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dp", type=int, default=1, help="data-parallel ranks (threads)")
    parser.add_argument("--gemm", type=int, default=256, help="GEMM size of the first table")
    return run_bench(parser, argv, run)


def run(args):
    print(gemm_table(args.gemm, repeats=10))
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=args.n_layer, n_head=4, d_model=args.d_model)
    policies = ["fp32", "fp16"] + (["bf16"] if dtypes.bfloat16 is not None else []) + ["fp8-current", "fp8-delayed", "fp8-blockwise"]
    print(f"\nGPT n_layer={args.n_layer} d_model={args.d_model} block 32, batch {args.batch}, dp={args.dp} "
          f"(threads), median of {args.steps} steps; bytes of rank 0 measured | planner formula")
    print(f"  {'policy':<14}{'step ms':>9}{'vs fp32':>9}{'params':>24}{'grads':>24}{'optim':>24}{'total':>24}")
    base = None
    for name in policies:
        seconds, memory, formula = step_row(name, config, args.dp, args.batch, args.steps)
        base = base or seconds
        cells = [f"{memory[k]:,} | {formula[k]:,}" for k in ("params", "grads", "optim")]
        cells.append(f"{sum(memory.values()):,} | {sum(formula.values()):,}")
        print(f"  {name:<14}{seconds * 1e3:>9.1f}{seconds / base:>8.2f}x" + "".join(f"{c:>24}" for c in cells))
    if dtypes.bfloat16 is None:
        print("  (bf16 left out: pip install -e '.[bf16]')")
    print(f"\n{precision_policy('fp16').name}: compute float16, masters/moments/reduction float32, loss scaling; "
          f"bytes per parameter 2 + 2(+4 master grad) + 12 = 20 vs fp32's 4 + 4 + 8 = 16: on one rank mixed "
          f"precision saves activations, not weights (ZeRO shards the 12)")
    return 0
