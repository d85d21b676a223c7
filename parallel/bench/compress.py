"""Communication-efficient data parallelism on a simulated link: time to a trained model.

    python -m parallel.bench compress [--dp 2 4] [--links 1gbe loopback] [--seeds 0 1 2]
                                      [--methods none powersgd:4 topk:0.01 sign local:4]

The addition task's default model (python -m parallel.train's defaults, float32), trained
under mpiexec with dp ranks, each method on each link (parallel.comm.link), evaluated every
--eval-every steps until held-out exact match reaches --target (95%) or --max-steps pass.
`local:H` is DiLoCo with H inner steps and its default outer optimizer (--local-steps H:
outer lr 0.7, Nesterov 0.9); `localsgd:H` is plain local SGD, model averaging every H
steps (--local-steps H --outer-lr 1 --outer-momentum 0). Per run (rank 0):

    bytes/step      dp bytes counted by the groups, mean over steps (local SGD: total / steps)
    modelled s      the link's modelled dp communication seconds per step, mean over steps
    step s          median wall time of a training step (evaluation excluded)
    exposed s       median per step of the time ranks spent blocked in communication
    steps, seconds  to reach the target (training time only; "-" if never reached)

With several seeds each figure is the median over seeds ("-" counts as never: the median of
the steps needs a majority of seeds that reached the target).
"""
import argparse
import time

import numpy as np

from minitensor.flags import AT_LEAST_1, parse_checked
from parallel.bench import collect, report
from parallel.launch import run_on_mpi_ranks

METHODS = ["none", "powersgd:4", "topk:0.01", "sign", "local:4"]


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m parallel.bench compress", description=__doc__.split("\n")[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4], help="dp sizes (default 2 4)")
    parser.add_argument("--links", nargs="+", default=["1gbe", "loopback"], help="links (default 1gbe loopback)")
    parser.add_argument("--methods", nargs="+", default=METHODS, help=f"methods (default {' '.join(METHODS)})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    parser.add_argument("--target", type=float, default=0.95, help="held-out exact match to reach (default 0.95)")
    parser.add_argument("--max-steps", type=int, default=1500, help="give up after this many steps (default 1500)")
    parser.add_argument("--eval-every", type=int, default=40, help="evaluate every N steps (default 40; a multiple of local:H)")
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "LINK", "SEED"), help=argparse.SUPPRESS)
    return parse_checked(parser, argv, {"dp": AT_LEAST_1, "max_steps": AT_LEAST_1, "eval_every": AT_LEAST_1})


def train_flags(method, link, seed, dp, max_steps):
    flags = ["--dp", dp, "--link", link, "--seed", seed, "--steps", max_steps]
    if method.startswith("local:"):
        return flags + ["--local-steps", method.split(":")[1]]
    if method.startswith("localsgd:"):
        return flags + ["--local-steps", method.split(":")[1], "--outer-lr", 1.0, "--outer-momentum", 0.0]
    return flags + ["--compress", method]


def main(argv):
    args = parse(argv)
    if args.worker:
        return run_worker(args)
    print(f"addition task, parallel.train's default model, float32; target {args.target:.0%} held-out exact "
          f"match, evaluated every {args.eval_every} steps, at most {args.max_steps} steps; seeds {args.seeds}; "
          f"mpiexec, 1 BLAS thread per rank")
    rows = []
    for dp in args.dp:
        for link in args.links:
            for method in args.methods:
                runs = []
                for seed in args.seeds:
                    flags = ["--worker", method, link, seed, "--dp", dp, "--max-steps", args.max_steps,
                             "--eval-every", args.eval_every, "--target", args.target]
                    runs += collect(run_on_mpi_ranks(dp, "parallel.bench", "compress", *flags))
                rows.append(summarise(dp, link, method, runs))
                print_row(rows[-1], header=len(rows) == 1)
    print_ratios(rows)
    return 0


def summarise(dp, link, method, runs):
    row = {"dp": dp, "link": link, "method": method, "seeds": len(runs)}
    for key in ("bytes_per_step", "modelled_s", "step_s", "exposed_s"):
        row[key] = float(np.median([r[key] for r in runs]))
    for key in ("steps_to_target", "seconds_to_target"):
        values = sorted(r[key] if r[key] is not None else np.inf for r in runs)
        row[key] = values[len(values) // 2]  # the median; inf (never) if most runs never got there
    row["final_metric"] = float(np.median([r["final_metric"] for r in runs]))
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
    """One run on the mpiexec ranks: parallel.train's model and steps, with an evaluation every
    --eval-every steps that stops the run at the target (all ranks agree by a broadcast)."""
    from parallel.comm import world
    from parallel.comm.link import with_link
    from parallel.train import build_parser
    from parallel.train.cli import check_args, fill_defaults
    from parallel.train.loop import build, evaluation, train_one_step
    from parallel.train.task import make_task

    method, link, seed = args.worker
    targs = fill_defaults(build_parser().parse_args(list(map(str, train_flags(method, link, seed, args.dp[0],
                                                                                args.max_steps)))))
    group = with_link(world(), targs.link)
    check_args(targs, group.size)
    task = make_task(targs)
    model = build(targs, task, group)
    step_times, exposed, modelled, nbytes, losses = [], [], [], [], []
    reached, trained, metric = None, 0.0, 0.0
    for step in range(1, targs.steps + 1):
        group.barrier()
        start = time.perf_counter()
        loss, stats = train_one_step(targs, model, task, step, None, group, losses)
        step_times.append(time.perf_counter() - start)
        trained += step_times[-1]
        losses.append(loss)
        exposed.append(sum(c.get("exposed_s", 0.0) for c in stats.values()))
        modelled.append(sum(c.get("modelled_s", 0.0) for (g, _), c in stats.items() if g == "dp"))
        nbytes.append(sum(c["bytes"] for (g, _), c in stats.items() if g == "dp"))
        if step % args.eval_every == 0 or step == targs.steps:
            if model.outer is not None and model.outer.inner_steps:
                model.outer.sync()  # evaluate the averaged model (its communication is not timed)
            _, value = evaluation(model, task, group)
            metric = group.broadcast(np.array([value[1] if value else 0.0]))[0]
            if metric >= args.target:
                reached = step
                break
    if group.rank == 0:
        report({"method": method, "link": link, "seed": int(seed), "dp": group.size,
                "bytes_per_step": float(np.mean(nbytes)), "modelled_s": float(np.mean(modelled)),
                "step_s": float(np.median(step_times)), "exposed_s": float(np.median(exposed)),
                "steps_to_target": reached, "seconds_to_target": trained if reached else None,
                "final_metric": float(metric)})
    return 0
