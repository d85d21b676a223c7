"""Pipeline parallelism on 2 and 4 ranks: step time, bubble and stored activations per schedule.

    python -m parallel.bench pp [--ranks 2 4] [--microbatches 2 4 8] [--schedules ...] [--steps 3] [--warmup 1]

The medium GPT (d_model 512, 4 layers, 8 heads, block 128, vocab 256, float32, AdamW)
cut into p stages, global batch 8, run under mpiexec -n p (launched here; more ranks than
cores are oversubscribed) with one BLAS thread per rank, for gpipe, 1f1b, 1f1b with
recomputation and the zero-bubble zb-h1 and zb-h2.

    step time    median over steps of the slowest rank's train_step + optimizer step
    bubble       measured: idle share of ranks x makespan in the last step's timeline
                 (waiting in send/recv counts as idle); theory: (p-1)/(m+p-1), and for
                 zb-h1/zb-h2 1 - 3m/(2m+p-1+max(m,p)), both with F = B = W;
                 at costs: the checker's simulation of the same lists with this run's
                 median forward, backward (B and W) times and free communication
    F / B / W    those median times in ms (for 1F1B and GPipe B is the whole backward)
    peak act.    most (micro-batch) graphs a stage held at once (for zb-*: counted until
                 their W), and their bytes
"""
import argparse

from minitensor.bench_cli import bench_parser, run_bench, threads_note
from minitensor.bench_timing import timed_calls
from minitensor.flags import AT_LEAST_1
from parallel.bench import collect, report, run_workers, slowest_median

CONFIG = dict(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512)
BATCH = 8
VARIANTS = {"gpipe": ("gpipe", False), "1f1b": ("1f1b", False), "1f1b+recompute": ("1f1b", True),
            "zb-h1": ("zb-h1", False), "zb-h2": ("zb-h2", False)}
SHOWN = (("1f1b", "zb-h1"), 4)  # the timelines drawn side by side: these schedules at this m


def main(argv):
    parser = bench_parser("python -m parallel.bench pp", __doc__, steps=3, warmup=1)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="pipeline sizes p (default 2 4)")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8],
                        help="micro-batch counts m (default 2 4 8; must divide the batch of 8)")
    parser.add_argument("--schedules", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                        help="which schedules (default: all)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return run_bench(parser, argv, run, {"microbatches": AT_LEAST_1})


def run(args):
    if args.worker:
        return run_worker(args.schedules, args.microbatches, args.steps, args.warmup)
    print(f"medium GPT {CONFIG}, global batch {BATCH}, float32, AdamW; p ranks under mpiexec, "
          f"{threads_note(args)}")
    for ranks in args.ranks:
        out = run_workers(ranks, "pp", args, "--microbatches", *args.microbatches, "--schedules", *args.schedules)
        (figures,) = collect(out)
        print(f"\npp = {ranks}")
        print_table(figures["rows"])
        for name, picture in figures["timelines"].items():
            print(f"\ntimeline of {name}, p = {ranks}, m = {SHOWN[1]} (one column = one median forward):")
            print(picture)
    return 0


def print_table(rows):
    mib = 2 ** 20
    print(f"{'schedule':<10} {'m':>2} {'step time':>10} {'bubble':>7} {'theory':>7} {'at costs':>8} "
          f"{'F / B / W ms':>16}   {'peak activations per stage (micro-batches, MiB)':<}")
    for r in rows:
        stages = "   ".join(f"s{s}: {n} ({b / mib:6.2f})" for s, (n, b) in enumerate(zip(r["peaks"], r["bytes"])))
        costs = " / ".join(f"{1e3 * t:.0f}" for t in r["costs"])
        print(f"{r['schedule']:<10} {r['m']:>2} {r['step_s']:>8.3f} s {r['bubble']:>7.3f} {r['theory']:>7.3f} "
              f"{r['at_costs']:>8.3f} {costs:>16}   {stages}")


def run_worker(schedules, microbatches, steps, warmup):
    import numpy as np

    import parallel

    group = parallel.world()
    rows, timelines = [], {}
    for name in schedules:
        for m in microbatches:
            pipe, step_s = run_case(group, *VARIANTS[name], m, steps, warmup)
            measured, theory = pipe.bubble()
            timeline = pipe.timeline()
            peaks = group.all_gather(np.array([pipe.peak_activations, pipe.peak_activation_bytes], dtype=np.int64))
            rows.append({"schedule": name, "m": m, "step_s": step_s, "bubble": measured,
                         "theory": theory, **bubble_at_measured_costs(timeline, pipe),
                         "peaks": peaks[0::2].tolist(), "bytes": peaks[1::2].tolist()})
            if name in SHOWN[0] and m == SHOWN[1]:
                slot = float(np.median([e.end - e.start for e in timeline.compute if e.kind == "forward"]))
                timelines[name] = timeline.render(slot=slot)
    if group.rank == 0:
        report({"rows": rows, "timelines": timelines})
    return 0


def bubble_at_measured_costs(timeline, pipe):
    """The checker's simulated bubble of the pipeline's lists with the step's median costs,
    and those costs (F, B, W seconds)."""
    import numpy as np

    from parallel.pipeline import Timeline, check_schedule, get_schedule

    def median(*kinds):
        spans = [e.end - e.start for e in timeline.compute if e.kind in kinds]
        return float(np.median(spans)) if spans else 0.0

    forward, weight = median("forward"), median("backward_weight")
    backward = median("backward") or median("backward_input") + weight
    events = check_schedule(get_schedule(pipe.schedule, pipe.p, pipe.m), pipe.p, pipe.m, forward_time=forward,
                            backward_time=backward, weight_time=weight if weight else None).events
    return {"at_costs": Timeline(events, pipe.p).bubble_fraction(), "costs": [forward, backward - weight, weight]}


def run_case(group, schedule, recompute, m, steps, warmup):
    """Train `warmup + steps` steps; the pipeline (for its last step's timeline) and the median
    of the slowest rank's timed steps."""
    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig
    from minitensor.optim import AdamW

    rng = np.random.default_rng(0)
    shape = (BATCH, CONFIG["block_size"])
    mt.manual_seed(0)
    pipe = parallel.Pipeline.from_gpt(GPT(GPTConfig(**CONFIG)), group, m, schedule, recompute=recompute)
    opt = AdamW(pipe.parameters(), lr=3e-4)

    def batch():
        return rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)

    def step(idx, targets):
        pipe.train_step(idx, targets)
        opt.step()

    return pipe, slowest_median(group, timed_calls(step, steps, warmup, before=batch))
