"""Chapter 9, part 3: every layout of the same ranks equals one device, name by name, step after step.

    python tutorials/09_3d/check_layouts.py --threads 8
    mpiexec -n 8 python -m mpi4py tutorials/09_3d/check_layouts.py [--sequence-parallel] [--zero]

For each layout dp × tp × pp of the world (default: six layouts of 8 ranks), trains a
HybridGPT for a few AdamW steps in float64 beside the single-device GPT (same seed, same
batches, same optimizer) and compares, on every rank, the gathered single-device-named
gradients and, after each step, the gathered parameters. Prints per layout the largest
relative difference of the loss, of the gradients and of the parameters (with the name
where it occurred), and at the end the largest over all layouts and steps.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import Mesh
from parallel.hybrid import HybridGPT
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments

CONFIG = GPTConfig(vocab_size=32, block_size=8, n_layer=8, n_head=4, d_model=16)
BATCH, SEQ, M = 16, 8, 2       # global batch, sequence length, micro-batches per dp rank
LR, SEED = 1e-2, 0
LAYOUTS = "2,2,2 1,2,4 4,2,1 2,4,1 8,1,1 1,1,8"
TOLERANCE = 1e-9


def batch(step):
    """The global batch of `step`: a pure function of (seed, step), the same on every rank."""
    rng = np.random.default_rng([SEED, step])
    return tuple(rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))


def fresh_gpt():
    mt.manual_seed(SEED)
    return GPT(CONFIG, dtype=np.float64)


def single_device_run(steps):
    """[(loss, gradients, parameters after the step)] of the dense GPT, step by step."""
    gpt = fresh_gpt()
    optimizer = AdamW(gpt.parameters(), lr=LR)
    history = []
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        _, loss = gpt(*batch(step))
        loss.backward()
        grads = {name: p.grad.copy() for name, p in gpt.named_parameters()}
        optimizer.step()
        history.append((loss.item(), grads, {name: p.data.copy() for name, p in gpt.named_parameters()}))
    return history


def worst_difference(got, ref, floor):
    """(largest relative difference, its name): max|got - ref| / max(max|ref|, floor) per tensor.

    The floor is for tensors that are zero in exact arithmetic. The attention key bias's
    gradient is one (softmax ignores a shift shared by every key): round-off around 0, so
    gradients are measured against 1e-6 of the largest gradient, as `--check` does. AdamW then
    moves that bias by lr * noise / eps — noise again, around 0 — so parameters smaller than
    1e-3 are measured against 1e-3: the contract's atol 1e-12 over its rtol 1e-9."""
    if list(got) != list(ref):
        raise AssertionError(f"names differ: {list(got)} vs {list(ref)}")
    diffs = {name: float(np.abs(got[name] - r).max()) / max(float(np.abs(r).max()), floor)
             for name, r in ref.items()}
    name = max(diffs, key=diffs.get)
    return diffs[name], name


def gradient_floor(grads):
    return 1e-6 * max(float(np.abs(g).max()) for g in grads.values())


PARAMETER_FLOOR = 1e-3


def check_layout(layout, reference, sequence_parallel, zero):
    """Train the layout beside the reference; this rank's worst (loss, grads, params) differences
    and the layout's loss at every step."""
    model = HybridGPT(fresh_gpt(), Mesh(*layout), microbatches=M, schedule="1f1b",
                      sequence_parallel=sequence_parallel, zero=zero)
    model.configure_optimizer(lr=LR)
    worst = {"loss": (0.0, ""), "gradients": (0.0, ""), "parameters": (0.0, "")}
    losses = []
    for step, (ref_loss, ref_grads, ref_params) in enumerate(reference, start=1):
        loss = model.train_step(*batch(step))
        losses.append(loss)
        found = {"loss": (abs(loss - ref_loss) / abs(ref_loss), ""),
                 "gradients": worst_difference(model.full_grads(), ref_grads, gradient_floor(ref_grads))}
        model.optimizer_step()
        found["parameters"] = worst_difference(model.full_state_dict(), ref_params, PARAMETER_FLOOR)
        worst = {kind: max(worst[kind], found[kind]) for kind in worst}
    return worst, losses


def main(layouts, steps, sequence_parallel, zero):
    world = parallel.world()
    say = print if world.rank == 0 else (lambda *args: None)
    flags = [f for f, on in (("sequence parallel", sequence_parallel), ("ZeRO-1", zero)) if on]
    say(f"{world.size} ranks ({world.backend} backend); GPT n_layer={CONFIG.n_layer} n_head={CONFIG.n_head} "
        f"d_model={CONFIG.d_model}, float64; global batch {BATCH} x {SEQ}, m = {M}, 1f1b, AdamW lr {LR}"
        + (f"; {', '.join(flags)}" if flags else ""))
    say(f"largest relative difference to one device over {steps} step(s), every rank's gathered copy:")
    reference = single_device_run(steps)
    overall, curves = 0.0, {"one device": [loss for loss, _, _ in reference]}
    for layout in layouts:
        worst, curves["dp{}·tp{}·pp{}".format(*layout)] = check_layout(layout, reference, sequence_parallel, zero)
        # The largest over all ranks (each compared its own gathered copy).
        values = world.all_reduce(np.array([worst[k][0] for k in worst]), op="max")
        overall = max(overall, float(values.max()))
        dp, tp, pp = layout
        say(f"  dp={dp} tp={tp} pp={pp}:  loss {values[0]:.1e}  gradients {values[1]:.1e} "
            f"({worst['gradients'][1]})  parameters {values[2]:.1e} ({worst['parameters'][1]})")
    say(f"largest over {len(layouts)} layout(s) x {steps} step(s): {overall:.1e} "
        f"(tolerance {TOLERANCE:g}): {'equal' if overall <= TOLERANCE else 'DIFFERENT'}")
    return curves  # the loss of every step, per layout: what tutorials/pictures/ draws


def parse_layouts(text):
    layouts = [tuple(int(v) for v in item.split(",")) for item in text.split()]
    if any(len(layout) != 3 for layout in layouts):
        raise ValueError(f"--layouts needs dp,tp,pp triples separated by spaces, got {text!r}")
    return layouts


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=8)
    parser.add_argument("--layouts", default=LAYOUTS, help=f"dp,tp,pp triples (default {LAYOUTS!r})")
    parser.add_argument("--steps", type=int, default=3, help="AdamW steps per layout (default 3)")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--zero", action="store_true", help="ZeRO-1: AdamW moments sharded over dp")
    args = parser.parse_args()
    run_on_ranks(args.threads, main, parse_layouts(args.layouts), args.steps, args.sequence_parallel, args.zero)
