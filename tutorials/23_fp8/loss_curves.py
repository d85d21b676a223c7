"""Chapter 23, part 3: one small GPT trained on the addition task in bf16, fp8-delayed and
fp8-blockwise, same seed, same batches (python -m parallel.train's job, one process).

    python tutorials/23_fp8/loss_curves.py [--steps 100]

bf16 computes everything in bfloat16 with float32 masters; the FP8 recipes keep float32
everywhere but the blocks' linears, whose products take FP8 operands (e4m3 forward; the
delayed recipe's gradients e5m2). Printed: the mean loss of the last 20 steps of each
and the gaps.
"""
import argparse
import contextlib
import io

import numpy as np

from parallel.train import main as train

MODEL = ["--d-model", "32", "--n-head", "4", "--n-layer", "2", "--batch", "32", "--digits", "2", "--seed", "0",
         "--lr", "3e-3"]
RECIPES = {"bf16": [], "fp8-delayed": [], "fp8-blockwise": ["--fp8-tile", "8"]}


def curves(steps):
    """{precision: the loss of every step}."""
    out = {}
    for name, extra in RECIPES.items():
        with contextlib.redirect_stdout(io.StringIO()):
            out[name] = train(MODEL + ["--steps", str(steps), "--precision", name, *extra])["losses"]
    return out


def main(args):
    losses = curves(args.steps)
    tail = {name: float(np.mean(curve[-20:])) for name, curve in losses.items()}
    for name, value in tail.items():
        print(f"{name:<14} loss at step 1 {losses[name][0]:.4f}, mean of the last 20 steps {value:.4f}")
    for name in ("fp8-delayed", "fp8-blockwise"):
        print(f"gap {name} - bf16: {tail[name] - tail['bf16']:+.4f} in the mean loss of the last 20 steps")
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    main(parser.parse_args())
