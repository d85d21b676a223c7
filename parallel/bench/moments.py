"""What bfloat16 AdamW moments cost and save: one AdamW step over P float32 parameters with
float32 moments and with bfloat16 ones (minitensor.narrow_moments).

    python -m parallel.bench moments [--params 4000000] [--steps 9] [--warmup 2]

One process, the two optimizers taking turns step by step (so a change of the machine's load
slows them alike), each over the same P parameters in one flat buffer. Printed per moment
dtype: the median step time, its ratio to float32's, and the bytes its moments hold. On a CPU
the bfloat16 step costs MORE time: numpy has no fused kernel that reads bfloat16, updates in
float32 and rounds on the store, so the step widens each block of the moments into float32
copies and writes them back (two more passes over them); a GPU's fused optimizer (Transformer
Engine's FusedAdam) does the conversion in registers, where the step is memory-bound and
moving half the moment bytes is the saving. What it buys here is the memory.
"""
import numpy as np

import minitensor as mt
from minitensor.bench_cli import bench_parser, run_bench
from minitensor.bench_timing import quartiles, timed_turns
from minitensor.flags import AT_LEAST_1
from minitensor.optim import AdamW

MOMENTS = ("float32", "bfloat16")


def optimizers(count):
    """{moment dtype: (AdamW, its parameter)} over the same `count` float32 values and gradient."""
    rng = np.random.default_rng(0)
    values, grad = rng.standard_normal(count).astype(np.float32), rng.standard_normal(count).astype(np.float32)
    out = {}
    for moments in MOMENTS:
        param = mt.nn.Parameter(values.copy())
        param.grad = grad.copy()
        out[moments] = (AdamW([param], lr=1e-3, moment_dtype=moments), param)
    return out


def run(args):
    built = optimizers(args.params)
    seconds = dict(zip(MOMENTS, timed_turns([built[m][0].step for m in MOMENTS], args.steps, args.warmup)))
    print(f"AdamW step over {args.params:,} float32 parameters, median of {args.steps} steps (one process, 1 BLAS "
          f"thread)")
    base = float(np.median(seconds["float32"]))
    for moments in MOMENTS:
        median, (low, high) = float(np.median(seconds[moments])), quartiles(seconds[moments])
        held = built[moments][0].state_bytes()
        print(f"{moments:<9} moments: {median * 1e3:8.2f} ms  (middle half {low * 1e3:.2f}-{high * 1e3:.2f})  "
              f"{median / base:5.2f}x  moments hold {held:,} bytes ({held / args.params:g} per parameter)")
    return 0


def main(argv=None):
    parser = bench_parser("python -m parallel.bench moments", __doc__, steps=9, warmup=2)
    parser.add_argument("--params", type=int, default=4_000_000, help="float32 parameters (default 4,000,000)")
    return run_bench(parser, argv, run, {"params": AT_LEAST_1})
