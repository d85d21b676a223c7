"""Communication-efficient data parallelism on a simulated link: time to a trained model.

    python -m parallel.bench compress [--dp 2 4] [--links 100mbe 1gbe loopback] [--seeds 0 1 2]
                                      [--methods none powersgd:4 topk:0.01 sign local:4 localsgd:4]
                                      [--timing-steps 32] [--results runs.jsonl]

The addition task's default model (python -m parallel.train's defaults, float32, but a
global batch of 128) under mpiexec with dp ranks. `local:H` is DiLoCo with H inner steps and parallel.train's outer
optimizer defaults (--local-steps H); `localsgd:H` is plain local SGD, model averaging
every H steps (--local-steps H --outer-lr 1 --outer-momentum 0).

A link only holds each operation's completion back; the arithmetic is the same bit for bit
(parallel.comm.link). So the steps to the target do not depend on the link, and the
benchmark measures the two factors of the time to the target apart:

    steps     per (dp, method, seed): trained on loopback, evaluated every --eval-every steps,
              until held-out exact match reaches --target (95%) or --max-steps pass
    timing    per (dp, link, method, seed), after all the steps runs of that dp, in turn:
              --timing-steps steps after 4 of warm-up, timed:
      bytes/step    dp bytes counted by the groups, mean per step (local SGD: one sync per H)
      modelled s    the link's modelled dp communication seconds, mean per step
      step s        wall time per step, the mean over the timed steps (evaluation excluded)
      exposed s     time the ranks spent blocked in communication, mean per step
    seconds = steps × step s: the seconds to the target on that link

Each figure is the median over seeds ("-" counts as never: the median of the steps needs a
majority of seeds that reached the target). --results FILE keeps every run as a JSON line
and skips the runs it already holds, so a long benchmark can be resumed or extended.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

from minitensor.bench_cli import bench_parser, run_bench, threads_note
from minitensor.flags import AT_LEAST_0, AT_LEAST_1
from parallel.bench import collect, report, run_workers

METHODS = ["none", "powersgd:4", "topk:0.01", "sign", "local:4", "localsgd:4"]
BATCH = 128  # the global batch of chapters 12 and 13's tables (the main job's recipe then; it trains at 64 now)
TIMING_WARMUP = 4  # steps run before the timed ones (first-touch allocations, caches)


def main(argv):
    parser = bench_parser("python -m parallel.bench compress", __doc__)
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4], help="dp sizes (default 2 4)")
    parser.add_argument("--links", nargs="+", default=["100mbe", "1gbe", "loopback"],
                        help="links (default 100mbe 1gbe loopback)")
    parser.add_argument("--methods", nargs="+", default=METHODS, help=f"methods (default {' '.join(METHODS)})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    parser.add_argument("--target", type=float, default=0.95, help="held-out exact match to reach (default 0.95)")
    parser.add_argument("--max-steps", type=int, default=1500, help="give up after this many steps (default 1500)")
    parser.add_argument("--eval-every", type=int, default=40, help="evaluate every N steps (default 40; a multiple of local:H)")
    parser.add_argument("--timing-steps", type=int, default=32,
                        help="timed steps per link (default 32; a multiple of local:H); 0: skip the timing")
    parser.add_argument("--results", metavar="FILE.jsonl", help="append each run here; runs already in it are skipped")
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "LINK", "SEED"), help=argparse.SUPPRESS)
    return run_bench(parser, argv, run, {"dp": AT_LEAST_1, "max_steps": AT_LEAST_1, "eval_every": AT_LEAST_1,
                                         "timing_steps": AT_LEAST_0})


def train_flags(method, link, seed, dp, max_steps):
    flags = ["--dp", dp, "--link", link, "--seed", seed, "--steps", max_steps, "--batch", BATCH]
    if method.startswith("local:"):
        return flags + ["--local-steps", method.split(":")[1]]
    if method.startswith("localsgd:"):
        return flags + ["--local-steps", method.split(":")[1], "--outer-lr", 1.0, "--outer-momentum", 0.0]
    return flags + ["--compress", method]


class Runs:
    """The runs done so far: {(kind, dp, link, method, seed): figures}, kept in --results FILE if given."""

    def __init__(self, path):
        self.path, self.done = Path(path) if path else None, {}
        if self.path and self.path.exists():
            for line in self.path.read_text().splitlines():
                figures = json.loads(line)
                self.done[self.key(figures)] = figures

    @staticmethod
    def key(figures):
        return tuple(figures[k] for k in ("kind", "dp", "link", "method", "seed"))

    def get(self, args, kind, dp, link, method, seed):
        """The run's figures: from the file, or run now (and appended to the file)."""
        found = self.done.get((kind, dp, link, method, seed))
        if found is not None:
            return found
        flags = [method, link, seed, "--dp", dp, "--max-steps", args.max_steps,
                 "--eval-every", args.eval_every, "--target", args.target,
                 "--timing-steps", args.timing_steps if kind == "timing" else 0]
        figures, = collect(run_workers(dp, "compress", args, *flags))
        self.done[self.key(figures)] = figures
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(figures) + "\n")
        return figures


def run(args):
    if args.worker:
        return run_worker(args)
    print(f"addition task, parallel.train's default model, float32; target {args.target:.0%} held-out exact "
          f"match, evaluated every {args.eval_every} steps, at most {args.max_steps} steps; seeds {args.seeds}; "
          f"mpiexec, {threads_note(args)}\nsteps to the target measured once per method and seed (on loopback: "
          f"a link changes no arithmetic); per link {args.timing_steps} timed steps; seconds = steps x step s",
          flush=True)
    runs, rows = Runs(args.results), []
    for dp in args.dp:
        steps = {method: [runs.get(args, "steps", dp, "loopback", method, seed) for seed in args.seeds]
                 for method in args.methods}
        # All timed runs of one dp together, every method and link in turn per seed: the load of a
        # shared machine changes over minutes and must fall on all of them alike.
        timing = {(method, link, seed): runs.get(args, "timing", dp, link, method, seed)
                  for seed in args.seeds for method in args.methods for link in args.links} if args.timing_steps else {}
        for method in args.methods:
            for link in args.links if args.timing_steps else []:
                rows.append(summarise(dp, link, method, steps[method], [timing[method, link, seed]
                                                                         for seed in args.seeds]))
                print_row(rows[-1], header=len(rows) == 1)
    print_ratios(rows)
    return 0


def median_steps(values):
    """The median, with None (never reached) counted as infinity."""
    values = sorted(v if v is not None else np.inf for v in values)
    return values[len(values) // 2]


def summarise(dp, link, method, steps, timing):
    row = {"dp": dp, "link": link, "method": method, "seeds": len(steps)}
    for key in ("bytes_per_step", "modelled_s", "step_s", "exposed_s"):
        row[key] = float(np.median([t[key] for t in timing]))
    row["steps_to_target"] = median_steps([s["steps_to_target"] for s in steps])
    row["seconds_to_target"] = row["steps_to_target"] * row["step_s"]
    row["final_metric"] = float(np.median([s["final_metric"] for s in steps]))
    return row


def print_row(row, header):
    if header:
        print(f"{'dp':>2} {'link':<8} {'method':<11} {'bytes/step':>11} {'modelled s':>10} {'step s':>7} "
              f"{'exposed s':>9} {'steps':>6} {'seconds':>8} {'final':>6}")
    steps = "-" if np.isinf(row["steps_to_target"]) else f"{row['steps_to_target']:.0f}"
    seconds = "-" if np.isinf(row["seconds_to_target"]) else f"{row['seconds_to_target']:.1f}"
    print(f"{row['dp']:>2} {row['link']:<8} {row['method']:<11} {row['bytes_per_step']:>11,.0f} "
          f"{row['modelled_s']:>10.4f} {row['step_s']:>7.3f} {row['exposed_s']:>9.4f} {steps:>6} {seconds:>8} "
          f"{row['final_metric']:>6.1%}", flush=True)


def print_ratios(rows):
    """Each method's seconds to target against plain DP's on the same dp and link."""
    print("seconds to target relative to plain DP (none) on the same dp and link (< 1: sooner):")
    for row in rows:
        base = next((r for r in rows if (r["dp"], r["link"], r["method"]) == (row["dp"], row["link"], "none")), None)
        if base is None or row["method"] == "none":
            continue
        ratio = row["seconds_to_target"] / base["seconds_to_target"]
        shown = f"{ratio:.2f}x" if np.isfinite(ratio) else "never / -"
        print(f"  dp {row['dp']} {row['link']:<8} {row['method']:<11} {shown}")


def run_worker(args):
    """One run on the mpiexec ranks, parallel.train's model and steps: with --timing-steps N,
    N timed steps after the warm-up; else to the target, with an evaluation every --eval-every
    steps that stops the run there (all ranks agree by a broadcast)."""
    from parallel.comm import world
    from parallel.comm.link import with_link
    from parallel.train import build_parser
    from parallel.train.cli import fill_defaults
    from parallel.train.flag_checks import check_args
    from parallel.train.loop import build, evaluation, train_one_step
    from parallel.train.task import make_task

    method, link, seed = args.worker
    targs = fill_defaults(build_parser().parse_args(list(map(str, train_flags(method, link, seed, args.dp[0],
                                                                                args.max_steps)))))
    group = with_link(world(), targs.link)
    check_args(targs, group.size)
    task = make_task(targs)
    model = build(targs, task, group)
    figures = {"method": method, "link": link, "seed": int(seed), "dp": group.size}
    if args.timing_steps:
        figures.update(kind="timing", **timed_steps(targs, model, task, group, args.timing_steps, train_one_step))
    else:
        figures.update(kind="steps", **steps_to_target(args, targs, model, task, group, train_one_step, evaluation))
    if group.rank == 0:
        report(figures)
    return 0


def timed_steps(targs, model, task, group, count, train_one_step):
    """Mean figures per step over `count` steps after TIMING_WARMUP untimed ones."""
    losses, exposed, modelled, nbytes = [], 0.0, 0.0, 0
    for step in range(1, TIMING_WARMUP + count + 1):
        if step == TIMING_WARMUP + 1:
            group.barrier()
            start = time.perf_counter()
        loss, stats = train_one_step(targs, model, task, step, None, group, losses)
        losses.append(loss)
        if step > TIMING_WARMUP:
            exposed += sum(c.get("exposed_s", 0.0) for c in stats.values())
            modelled += sum(c.get("modelled_s", 0.0) for (g, _), c in stats.items() if g == "dp")
            nbytes += sum(c["bytes"] for (g, _), c in stats.items() if g == "dp")
    group.barrier()
    seconds = time.perf_counter() - start
    return {"bytes_per_step": nbytes / count, "modelled_s": modelled / count, "step_s": seconds / count,
            "exposed_s": exposed / count}


def steps_to_target(args, targs, model, task, group, train_one_step, evaluation):
    """Train until the held-out exact match reaches args.target: {steps_to_target (None if
    never), final_metric}."""
    losses, metric = [], 0.0
    for step in range(1, targs.steps + 1):
        loss, _ = train_one_step(targs, model, task, step, None, group, losses)
        losses.append(loss)
        if step % args.eval_every == 0 or step == targs.steps:
            if model.outer is not None and model.outer.inner_steps:
                model.outer.sync()  # evaluate the averaged model
            _, value = evaluation(model, task, group)
            metric = float(group.broadcast(np.array([value[1] if value else 0.0]))[0])
            if metric >= args.target:
                return {"steps_to_target": step, "final_metric": metric}
    return {"steps_to_target": None, "final_metric": metric}
