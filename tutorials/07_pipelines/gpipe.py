"""Chapter 7: cut a GPT into pipeline stages and run GPipe over micro-batches.

    python tutorials/07_pipelines/gpipe.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/07_pipelines/gpipe.py [--trace gpipe.trace.json]

One pipeline stage per rank (p = number of ranks). Prints: how the model is cut
(blocks and parameters per stage), the GPipe action lists as data, the schedule's
simulated timeline and bubble next to the formula, then real training steps for
m = 1, 2, 4, 8 micro-batches — loss and gradient difference to one device, the median
measured bubble of REPEATS steps vs theory — the measured timeline, and where the
Chrome trace was written. Under --threads the measured times are not a performance
measurement (README, "What the timings mean").
"""
import os
import tempfile
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from parallel import Pipeline
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.pipeline import Timeline, bubble_theory, check_schedule, gpipe, split_gpt

CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, d_model=128)
BATCH, SEQ = 16, 32
MICROBATCHES = (1, 2, 4, 8)
SHOWN_M = 4
REPEATS = 5      # timed steps per m after a warm-up step: their median bubble is printed
BALANCE = None   # blocks per stage, e.g. [1, 3]; None: balanced by parameter count


def dense_reference(idx, targets):
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    _, loss = gpt(idx, targets)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in gpt.named_parameters()}


def main(trace_path):
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    p = group.size
    mt.manual_seed(0)
    say(f"p = {p} pipeline stage(s), one per rank ({group.backend} backend); "
        f"GPT with {CONFIG.n_layer} blocks, d_model {CONFIG.d_model}")

    how = "balanced by parameter count" if BALANCE is None else f"balance={BALANCE}"
    say(f"\nthe cut ({how}; embeddings on the first stage, head on the last):")
    for stage in split_gpt(GPT(CONFIG), p, BALANCE):
        parts = (["embeddings"] if stage.is_first else []) + [f"blocks {stage.blocks.indices()}"] + \
                (["ln_f + lm_head + loss"] if stage.is_last else [])
        say(f"  stage {stage.stage} on rank {stage.stage}: {', '.join(parts)}: "
            f"{stage.num_parameters():,} parameters")

    say("\nthe schedule is data: GPipe's action list per rank for m = 2")
    for rank, actions in enumerate(gpipe(p, 2)):
        say(f"  rank {rank}: " + "; ".join(str(a) for a in actions))

    report = check_schedule(gpipe(p, SHOWN_M), p, SHOWN_M)
    simulated = Timeline(report.events, p)
    say(f"\nsimulated GPipe, m = {SHOWN_M} (forward 1 unit, backward 2 units), checked deadlock-free:")
    say(simulated.render())
    say(f"simulated bubble: {simulated.bubble_fraction():.4f}   theory (p-1)/(m+p-1): "
        f"{bubble_theory(p, SHOWN_M):.4f}")

    rng = np.random.default_rng(1)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))
    ref_loss, ref_grads = dense_reference(idx, targets)
    say(f"\nreal steps on {p} rank(s), global batch {BATCH} x {SEQ} tokens, float64; "
        f"bubble: the median of {REPEATS} steps after a warm-up step:")
    shown = None
    for m in MICROBATCHES:
        mt.manual_seed(0)
        pipe = Pipeline.from_gpt(GPT(CONFIG).double(), group, microbatches=m, schedule="gpipe", balance=BALANCE)
        pipe.train_step(idx, targets)            # a warm-up step: first calls are slower
        bubbles = []
        for _ in range(REPEATS):                 # one step's timing is noise; the median of several is less so
            loss = pipe.train_step(idx, targets)
            bubbles.append(pipe.bubble()[0])
        grads = pipe.full_grads()
        grad_diff = max(np.abs(grads[n] - ref_grads[n]).max() for n in ref_grads)
        theory = pipe.bubble()[1]
        say(f"  m={m:<2} loss diff={abs(loss - ref_loss):9.1e}  grad diff={grad_diff:9.1e}  "
            f"bubble measured={np.median(bubbles):6.3f}  theory={theory:6.3f}  "
            f"(steps: {min(bubbles):.3f} to {max(bubbles):.3f})")
        if m == SHOWN_M:
            shown = pipe.timeline()
    say(f"\nmeasured timeline of the last m = {SHOWN_M} step "
        f"(one column = the shortest forward or backward, in seconds):")
    say(shown.render())
    if group.rank == 0:
        shown.save_chrome_trace(trace_path)
    say(f"Chrome trace written to {trace_path}: open it at https://ui.perfetto.dev")
    return simulated, shown  # the two timelines printed above: what tutorials/pictures/ draws


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    parser.add_argument("--trace", default=os.path.join(tempfile.gettempdir(), "gpipe.trace.json"),
                        help="where to write the Chrome trace of the m=4 step")
    args = parser.parse_args()
    run_on_ranks(args.threads, main, args.trace)
