"""Check the planner against real runs: per-rank memory, and the ranking of step times.

    python -m parallel.plan.validate [--config medium] [--batch 8] [--steps 3] [--repeats 3]
                                     [--device laptop-cpu ...] [--calibrate] [--microbatches 2]
                                     [--ranks 4]

Launches ONE `mpiexec -n RANKS` job (one BLAS thread per rank) that trains every layout of
that many ranks the config can take (4: dp4, dp2·tp2, dp2·pp2, tp2·pp2, tp4, pp4, with
ZeRO-1/2/3 and activation-recomputation variants; 2: dp2, tp2, pp2, dp2 ZeRO-1 and ZeRO-3,
dp2, tp2, pp2 with recomputation, and pp2 under ZB-H1 and DualPipeV, the V where m ≥ 4), each with every micro-batch count of
`--microbatches` (a list: 1,2,4), for a few float32 steps of a HybridGPT, in `--repeats`
interleaved sweeps; a layout's time is the median over sweeps of its median step time
(`--statistic fastest`: of its fastest step; slowest rank, after one warm-up step), shown
with the sweeps' range, the run-to-run noise. Every rank also reports its measured parameter, gradient and optimizer-state bytes.
Each sweep first measures the per-part costs (parallel/plan/parts.py) of every micro-batch
size and tp the layouts use, on all ranks at once (so the parts share the cores as the
runs do), and the all-reduce on groups of each size the layouts form, all groups at once
(validate_worker.measure_collectives: on 4 ranks sharing 2 cores a collective waits for
every member to be scheduled, which a ping-pong between two ranks does not see). Rank 0
prints one JSON line per layout (and part) and sweep; the parent compares:

    memory   measured bytes vs `param_bytes_per_rank` for every rank (relative error)
    time     the closed form's (cost.estimate) and the simulation's (simulate.py, from the
             measured parts) predicted times vs the measured ones: Spearman's rho and
             Kendall's tau of the order (1 = same order, -1 = reversed) and each
             prediction's relative error

`--calibrate` first measures this machine (`python -m parallel.plan --calibrate`) and
also predicts with that profile. This is a report, not a timed test.
"""
import argparse
import functools
import json
import os
import sys
from pathlib import Path

import numpy as np

from ..launch import run_on_mpi_ranks
from ..pipeline.partition import balance_by_parameters
from .cost import estimate
from .dual import stage_count
from .layout import Layout
from .memory import micro_batch_size, param_bytes_per_rank
from .model import DEFAULT_BATCH, get_config
from .profiles import load_profile
from .rank_stats import kendall, separated, spearman
from .simulate import PartCosts, simulate_step
from .validate_worker import KINDS, LAYOUTS, dense_gpt, unpack, worker


def layout_name(dp, tp, pp, zero, recompute=False, schedule="1f1b"):
    return (f"dp{dp}·tp{tp}·pp{pp}" + (f" zero{zero}" if zero else "") + (" recompute" if recompute else "")
            + (f" {schedule}" if schedule != "1f1b" else ""))


@functools.cache
def balance_of(config, pp):
    """The blocks per stage HybridGPT uses by default (balanced by parameter count)."""
    return balance_by_parameters(dense_gpt(config), pp)


STATISTICS = ("median", "fastest")


def sweep_seconds(line, statistic):
    """A sweep's step time of one layout: the median of its timed steps (the worker's
    "seconds"), or the fastest of them. The fastest is what timeit reports: a step can only
    be slowed by the machine (another process, a slow spell), never sped up, so the fastest
    is the one least disturbed."""
    if statistic == "median":
        return line["seconds"]
    if "steps" not in line:
        raise SystemExit("python -m parallel.plan.validate: --statistic fastest needs each step's time (\"steps\"), "
                         "which this file's layouts do not hold (it was saved before they were recorded); "
                         "use --statistic median")
    return min(line["steps"])


def merge_sweeps(lines, statistic="median"):
    """One result per (layout, micro-batches): the median over its sweeps of `sweep_seconds`,
    their range, and how many sweeps and timed steps per sweep there were (steps: None in
    files saved before each step's time was recorded)."""
    by_layout = {}
    for line in lines:
        by_layout.setdefault((tuple(line["layout"]), line.get("microbatches")), []).append(line)
    results = []
    for (layout, m), runs in by_layout.items():
        seconds = [sweep_seconds(run, statistic) for run in runs]
        results.append({"layout": list(layout), "microbatches": m, "memory": runs[0]["memory"],
                        "seconds": float(np.median(seconds)), "spread": (min(seconds), max(seconds)),
                        "sweeps": len(runs), "steps": len(runs[0]["steps"]) if "steps" in runs[0] else None})
    return results


def merge_parts(lines):
    """{(b, tp): PartCosts}, each figure the median over the sweeps."""
    by_key = {}
    for line in lines:
        by_key.setdefault(tuple(line["parts"]), []).append(line["costs"])
    median = lambda runs, key: np.median([r[key] for r in runs], axis=0)  # noqa: E731
    return {key: PartCosts(*(tuple(median(runs, k)) for k in ("embed", "block", "head")),
                           float(median(runs, "optimizer_per_param")))
            for key, runs in by_key.items()}


def merge_links(lines):
    """The median α, bandwidth and alone speed-up over the sweeps (no speed-up measured: 1),
    and each group size's fitted collective link, figure by figure (none in older files)."""
    merged = {key: float(np.median([line["link"].get(key, 1.0) for line in lines]))
              for key in ("alpha_us", "bandwidth_gbps", "alone_speedup")}
    fitted = [line["link"]["collectives"] for line in lines if "collectives" in line["link"]]
    merged["collectives"] = {int(n): {key: float(np.median([f[n][key] for f in fitted]))
                                      for key in ("alpha_us", "bandwidth_gbps")}
                             for n in (fitted[0] if fitted else {})}
    return merged


def measure(config_name, batch, microbatch_counts, steps, repeats, timeout, ranks):
    """The worker's JSON lines of one mpiexec job on `ranks` ranks."""
    try:
        output = run_on_mpi_ranks(ranks, "parallel.plan.validate", "--worker", "--config", config_name,
                                  "--batch", batch, "--microbatches", ",".join(map(str, microbatch_counts)),
                                  "--steps", steps, "--repeats", repeats, timeout=timeout)
    except RuntimeError as error:
        raise SystemExit(f"python -m parallel.plan.validate: {error}") from None
    return [line for line in output.splitlines() if line.startswith("{")]


def merge(lines, statistic="median"):
    """(layout results, {(b, tp): PartCosts}, link figures) of the worker's JSON lines."""
    lines = [json.loads(line) for line in lines]
    return (merge_sweeps([line for line in lines if "layout" in line], statistic),
            merge_parts([line for line in lines if "parts" in line]),
            merge_links([line for line in lines if "link" in line]))


def with_link(profile, link):
    """`profile` with its intra-node link replaced by the measured one."""
    figures = {key: link[key] for key in ("alpha_us", "bandwidth_gbps")}
    return {**profile, "name": f"{profile['name']}, measured link", "intra": figures}


def memory_errors(config, results):
    """[(layout name, rank, kind, measured, predicted, relative error)] for every rank."""
    rows = []
    for result in results:
        dp, tp, pp, zero, recompute, schedule = unpack(result["layout"])
        balance = balance_of(config, stage_count(schedule, pp))
        for rank, measured in enumerate(result["memory"]):
            coords = (rank // tp % dp, rank % tp, rank // (tp * dp))
            predicted = param_bytes_per_rank(config, dp, tp, pp, coords, "float32", zero, balance, schedule=schedule)
            for kind in KINDS:
                error = abs(measured[kind] - predicted[kind]) / predicted[kind]
                rows.append((layout_name(dp, tp, pp, zero, recompute, schedule), rank, kind, measured[kind],
                             predicted[kind], error))
    return rows


def report_memory(config, results):
    rows = memory_errors(config, results)
    worst = max(rows, key=lambda row: row[-1])
    print(f"memory: {len(rows)} figures (params, grads, optim on every rank of {len(results)} layouts); "
          f"largest relative error {worst[-1]:.2%} ({worst[0]} rank {worst[1]} {worst[2]}: "
          f"measured {worst[3]} B, predicted {worst[4]} B)")
    return rows


def layout_of(result):
    dp, tp, pp, zero, recompute, schedule = unpack(result["layout"])
    return Layout(dp, tp, pp, result["microbatches"], zero=zero, recompute=recompute, schedule=schedule)


def predictions(config, batch, profile, results, parts, link):
    """{"closed form": [s], "simulated": [s]} for each result (closed form: cost.estimate with
    `profile`; simulated: the measured parts of its micro-batch size and tp, the measured link,
    the ranks sharing this machine's cores)."""
    closed, simulated, measured_link = [], [], with_link(profile, link)
    for result in results:
        layout = layout_of(result)
        balance = balance_of(config, stage_count(layout.schedule, layout.pp))  # the V's: its 2·pp stages
        closed.append(estimate(config, layout, batch, profile, balance=balance).time["total"])
        b = micro_batch_size(batch, layout)
        simulated.append(float(simulate_step(config, layout, batch, parts[(b, layout.tp)], measured_link, balance,
                                             alone_speedup=link["alone_speedup"],
                                             collectives=link["collectives"]).total))
    return {"closed form": closed, "simulated": simulated}


def noise(results):
    """The run-to-run noise: the median over layouts of (max − min) / median of its sweeps."""
    return float(np.median([(r["spread"][1] - r["spread"][0]) / r["seconds"] for r in results]))


def report_time(config, batch, profile, results, parts, link):
    predicted = predictions(config, batch, profile, results, parts, link)
    measured = [r["seconds"] for r in results]
    print(f"\nstep time, {config} batch {batch}, profile {profile['name']} (the simulation: its measured link, "
          f"α {link['alpha_us']:.3g} µs, {link['bandwidth_gbps']:.3g} GB/s; a rank alone {link['alone_speedup']:.3g}× "
          f"as fast as all at once); run-to-run noise "
          f"(median (max-min)/median of the sweeps): {noise(results):.1%}")
    for n, fitted in sorted(link["collectives"].items()):
        print(f"all-reduce on groups of {n} ranks, all at once: α {fitted['alpha_us']:.3g} µs, "
              f"{fitted['bandwidth_gbps']:.3g} GB/s (the simulation's tp and dp collectives of {n} ranks)")
    print(f"{'layout':<23}{'m':>3}{'closed s':>10}{'simulated s':>13}{'measured s':>12}{'(min-max of sweeps)':>22}"
          f"{'sim error':>11}")
    for r, closed, simulated, m in zip(results, predicted["closed form"], predicted["simulated"], measured):
        spread = f"({r['spread'][0]:.3g}-{r['spread'][1]:.3g})"
        print(f"{layout_name(*unpack(r['layout'])):<23}{r['microbatches']:>3}{closed:>10.4g}{simulated:>13.4g}{m:>12.4g}"
              f"{spread:>22}{(simulated - m) / m:>+11.1%}")
    chain = separated(measured, noise(results))
    for name, values in predicted.items():
        errors = [abs(p - m) / m for p, m in zip(values, measured)]
        apart = [values[i] for i in chain]
        print(f"{name}: Spearman rho = {spearman(values, measured):+.3f}, Kendall tau = "
              f"{kendall(values, measured):+.3f}, largest error {max(errors):.1%}, within 25%: "
              f"{sum(e <= 0.25 for e in errors)} of {len(errors)}; over the {len(chain)} layouts further apart "
              f"than the noise: rho = {spearman(apart, [measured[i] for i in chain]):+.3f}")
    return predicted, measured


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m parallel.plan.validate", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="medium", help="named model config (default medium)")
    parser.add_argument("--batch", type=int, help="global batch (default: the config's usual one)")
    parser.add_argument("--microbatches", type=micro_batch_counts, default=[2],
                        help="micro-batch counts to run every layout with, e.g. 1,2,4 (default 2)")
    parser.add_argument("--ranks", type=int, choices=sorted(LAYOUTS), default=4,
                        help="the job's ranks; 4 on 2 cores oversubscribes them (said in the output)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="sweeps over the layouts (median taken)")
    parser.add_argument("--device", action="append", help="profile(s) to predict with (repeatable; "
                        "default laptop-cpu)")
    parser.add_argument("--calibrate", action="store_true", help="measure this machine first and also "
                        "predict with that profile")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--statistic", choices=STATISTICS, default="median",
                        help="a sweep's time of a layout: the median of its timed steps (default) or the fastest")
    parser.add_argument("--save", help="also write the worker's raw JSON lines to this file")
    parser.add_argument("--load", help="report from a file --save wrote instead of running the job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    batch = args.batch or DEFAULT_BATCH[args.config]
    if args.worker:
        return worker(args.config, batch, args.microbatches, args.steps, args.repeats)
    profiles = [load_profile(name) for name in args.device or ["laptop-cpu"]]
    if args.calibrate:
        from .calibrate import calibrate
        profiles.append(calibrate())
    if args.load:
        lines = Path(args.load).read_text().splitlines()
    else:
        lines = measure(args.config, batch, args.microbatches, args.steps, args.repeats, args.timeout, args.ranks)
    if args.save:
        Path(args.save).write_text("\n".join(lines) + "\n")
    results, parts, link = merge(lines, args.statistic)
    config = get_config(args.config)
    cores = os.cpu_count()
    print(f"{args.ranks} MPI ranks on {cores} cores{' (oversubscribed)' if args.ranks > cores else ''}, "
          f"one BLAS thread each; {results[0]['sweeps']} sweeps of {results[0]['steps'] or '(unrecorded)'} timed "
          f"steps, a sweep's time of a layout the {args.statistic} of its steps")
    report_memory(config, results)
    for profile in profiles:
        report_time(config, batch, profile, results, parts, link)
    return 0


def micro_batch_counts(text):
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--microbatches {text!r}: give positive counts separated by commas, e.g. 1,2,4")
    return counts


if __name__ == "__main__":
    sys.exit(main())
