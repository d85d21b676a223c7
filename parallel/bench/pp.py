"""Pipeline parallelism on 2 ranks: step time, bubble and stored activations per schedule.

    python -m parallel.bench pp [--microbatches 1 2 4 8] [--steps 3] [--warmup 1]

The medium GPT (d_model 512, 4 layers, 8 heads, block 128, vocab 256, float32, AdamW)
cut into 2 stages of 2 blocks, global batch 8, run under mpiexec -n 2 (launched here)
with one BLAS thread per rank, for gpipe, 1f1b and 1f1b with checkpointing.

    step time    median over steps of the slowest rank's train_step + optimizer step
    bubble       measured: idle share of ranks x makespan in the last step's timeline
                 (waiting in send/recv counts as idle); theory: (p-1)/(m+p-1)
    peak act.    most (micro-batch) graphs a stage held at once, and their bytes
"""
import argparse
import time

from minitensor.flags import AT_LEAST_0, AT_LEAST_1, parse_checked
from parallel.bench import collect, report
from parallel.launch import run_on_mpi_ranks

CONFIG = dict(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512)
BATCH, RANKS = 8, 2
VARIANTS = (("gpipe", "gpipe", False), ("1f1b", "1f1b", False), ("1f1b+ckpt", "1f1b", True))
SHOWN = ("1f1b", 4)  # the case whose timeline is drawn


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m parallel.bench pp", description=__doc__.split("\n")[0])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="micro-batch counts m (default 1 2 4 8; must divide the batch of 8)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per case (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parse_checked(parser, argv, {"microbatches": AT_LEAST_1, "steps": AT_LEAST_1, "warmup": AT_LEAST_0})


def main(argv):
    args = parse(argv)
    if args.worker:
        return run_worker(args.microbatches, args.steps, args.warmup)
    print(f"medium GPT {CONFIG}, global batch {BATCH}, float32, AdamW; pp = {RANKS} ranks under mpiexec, "
          f"1 BLAS thread per rank")
    out = run_on_mpi_ranks(RANKS, "parallel.bench", "pp", "--worker", "--steps", args.steps,
                           "--warmup", args.warmup, "--microbatches", *args.microbatches)
    (figures,) = collect(out)
    print_table(figures["rows"])
    if figures["timeline"]:  # drawn only when the shown case was among those run
        print(f"\ntimeline of {SHOWN[0]}, m = {SHOWN[1]} (one column = one median forward):")
        print(figures["timeline"])
    return 0


def print_table(rows):
    mib = 2 ** 20
    print(f"{'schedule':<10} {'m':>2} {'step time':>10} {'bubble':>7} {'theory':>7}   "
          f"{'peak activations per stage (micro-batches, MiB)':<}")
    for r in rows:
        stages = "   ".join(f"s{s}: {n} ({b / mib:6.2f})" for s, (n, b) in enumerate(zip(r["peaks"], r["bytes"])))
        print(f"{r['schedule']:<10} {r['m']:>2} {r['step_s']:>8.3f} s {r['bubble']:>7.3f} {r['theory']:>7.3f}   "
              f"{stages}")


def run_worker(microbatches, steps, warmup):
    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig
    from minitensor.optim import AdamW

    group = parallel.world()
    rng = np.random.default_rng(0)
    shape = (BATCH, CONFIG["block_size"])
    rows, shown = [], None
    for name, schedule, checkpoint in VARIANTS:
        for m in microbatches:
            mt.manual_seed(0)
            pipe = parallel.Pipeline.from_gpt(GPT(GPTConfig(**CONFIG)), group, m, schedule, checkpoint=checkpoint)
            opt = AdamW(pipe.parameters(), lr=3e-4)
            times = np.empty(steps)
            for step in range(warmup + steps):
                idx, targets = rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)
                start = time.perf_counter()
                pipe.train_step(idx, targets)
                opt.step()
                if step >= warmup:
                    times[step - warmup] = time.perf_counter() - start
            group.all_reduce(times, op="max")
            measured, theory = pipe.bubble()
            peaks = group.all_gather(np.array([pipe.peak_activations, pipe.peak_activation_bytes], dtype=np.int64))
            rows.append({"schedule": name, "m": m, "step_s": float(np.median(times)), "bubble": measured,
                         "theory": theory, "peaks": peaks[0::2].tolist(), "bytes": peaks[1::2].tolist()})
            if (name, m) == SHOWN:
                timeline = pipe.timeline()
                slot = float(np.median([e.end - e.start for e in timeline.compute if e.kind == "forward"]))
                shown = timeline.render(slot=slot)
    if group.rank == 0:
        report({"rows": rows, "timeline": shown})
    return 0
