"""Chapter 23, part 4: AdamW's moments in bfloat16 (DeepSeek-V3 §3.3.1), its bytes and its loss.

    python tutorials/23_fp8/bf16_moments.py [--steps 100]

The bytes per parameter the planner counts (parallel.plan) beside those a real AdamW holds
(state_bytes), with float32 and with bfloat16 moments; then one small GPT trained twice on the
addition task under --precision bf16, same seed and batches, once with each moment dtype
(python -m parallel.train's job, one process). Printed: both runs' losses and the gap.
"""
import argparse
import contextlib
import io

import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel.plan.layout import BF16_MOMENTS, get_precision
from parallel.train import main as train

MODEL = ["--d-model", "32", "--n-head", "4", "--n-layer", "2", "--batch", "32", "--digits", "2", "--seed", "0",
         "--lr", "3e-3", "--precision", "bf16"]


def bytes_per_parameter():
    """(planner: master + moments bytes, held by a stepped AdamW: moment bytes) per parameter, by moment dtype."""
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8))
    count = sum(p.size for p in model.parameters())
    out = {}
    for moments, suffix in (("float32", ""), ("bfloat16", BF16_MOMENTS)):
        precision = get_precision("bf16" + suffix)
        optimizer = AdamW(model.parameters(), moment_dtype=moments)
        for p in model.parameters():
            p.grad = np.zeros_like(p.data)
        optimizer.step()
        out[moments] = (precision.master_bytes + precision.optim_bytes, optimizer.state_bytes() / count)
    return out


def losses(steps):
    """{moment dtype: the loss of every step}."""
    out = {}
    for moments in ("float32", "bfloat16"):
        with contextlib.redirect_stdout(io.StringIO()):
            out[moments] = train(MODEL + ["--steps", str(steps), "--moment-dtype", moments])["losses"]
    return out


def main(args):
    mt.manual_seed(0)
    for moments, (planned, held) in bytes_per_parameter().items():
        print(f"{moments:<9} moments: optimizer state beside float32 masters {planned} bytes per parameter "
              f"(planner), the moments AdamW holds {held:g}")
    curves = losses(args.steps)
    tail = {moments: float(np.mean(curve[-20:])) for moments, curve in curves.items()}
    for moments, curve in curves.items():
        print(f"{moments:<9} moments: loss after step 1 {curve[1]:.6f}, mean of the last 20 steps {tail[moments]:.4f}")
    print(f"gap bfloat16 - float32 moments: {tail['bfloat16'] - tail['float32']:+.4f} in the mean loss of the last "
          f"20 steps; largest gap at any step {max(abs(a - b) for a, b in zip(*curves.values())):.4f}")
    return curves


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    main(parser.parse_args())
