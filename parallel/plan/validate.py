"""Check the planner against real runs: per-rank memory, and the ranking of step times.

    python -m parallel.plan.validate [--config medium] [--batch 8] [--steps 3] [--repeats 3]
                                     [--device laptop-cpu ...] [--calibrate] [--microbatches 2]

Launches ONE `mpiexec -n 4` job (one BLAS thread per rank) that trains every 4-rank
layout the config can take (dp4, dp2·tp2, dp2·pp2, tp2·pp2, tp4, pp4, dp2·tp2 ZeRO-1) for a
few float32 steps of a HybridGPT, in `--repeats` interleaved sweeps; a layout's time is
the median over sweeps of its median step time (slowest rank, after one warm-up step),
shown with the sweeps' range, the run-to-run noise. Every rank also reports its measured
parameter, gradient and optimizer-state bytes. Rank 0 prints one JSON line per layout and
sweep; the parent compares:

    memory   measured bytes vs `param_bytes_per_rank` for every rank (relative error)
    time     the planner's predicted order of the layouts vs the measured order, with
             Spearman's rho and Kendall's tau (1 = same order, -1 = reversed)

`--calibrate` first measures this machine (`python -m parallel.plan --calibrate`) and
also predicts with that profile. This is a report, not a timed test.
"""
import argparse
import dataclasses
import json
import sys
import time

import numpy as np

import minitensor as mt
from minitensor.models import gpt as dense

from ..comm import world
from ..comm.gather import all_gather_ragged
from ..hybrid import HybridGPT
from ..launch import run_on_mpi_ranks
from ..mesh import Mesh
from ..pipeline.partition import balance_by_parameters
from .cost import estimate
from .layout import Layout
from .memory import param_bytes_per_rank
from .model import DEFAULT_BATCH, get_config
from .profiles import load_profile

LAYOUTS = [(4, 1, 1, 0), (2, 2, 1, 0), (2, 1, 2, 0), (1, 2, 2, 0), (1, 4, 1, 0), (1, 1, 4, 0), (2, 2, 1, 1),
           (2, 1, 2, 2), (4, 1, 1, 3)]  # the last number: the ZeRO stage
RANKS = 4
KINDS = ("params", "grads", "optim")


def measure_memory(model):
    """{"params", "grads", "optim"} bytes this rank holds (HybridGPT.memory_bytes: live arrays):
    local parameters or their ZeRO-3 shards, their gradients or ZeRO-2/3 shards (call after
    the gradient sync, before the optimizer zeroes them), the optimizer's state; under a
    mixed precision policy the float32 masters count as optimizer state and their gradients
    as gradients."""
    held = model.memory_bytes()
    return {kind: held[kind] for kind in KINDS}


def layout_name(dp, tp, pp, zero):
    return f"dp{dp}·tp{tp}·pp{pp}" + (f" zero{zero}" if zero else "")


def dense_gpt(config):
    """The float32 minitensor GPT of a planner config, seeded alike on every rank."""
    mt.manual_seed(0)
    return dense.GPT(dense.GPTConfig(**dataclasses.asdict(config)), dtype=np.float32)


def balance_of(config, pp):
    """The blocks per stage HybridGPT uses by default (balanced by parameter count)."""
    return balance_by_parameters(dense_gpt(config), pp)


def run_layout(group, config, layout, batch, microbatches, steps):
    """Worker side: train one layout; (median step seconds, [memory of every rank])."""
    dp, tp, pp, zero = layout
    model = HybridGPT(dense_gpt(config), Mesh(dp, tp, pp, world=group), microbatches=microbatches, zero=zero)
    model.configure_optimizer()
    rng = np.random.default_rng(0)
    idx = rng.integers(0, config.vocab_size, (batch, config.block_size))
    times = []
    for step in range(steps + 1):
        group.barrier()
        start = time.perf_counter()
        model.train_step(idx, np.roll(idx, -1, axis=1))
        model.finish_grad_sync()
        if step == steps:  # the optimizer holds its state since the first step
            memory = measure_memory(model)
        model.optimizer_step()
        group.barrier()
        times.append(time.perf_counter() - start)
    mine = np.array([memory[k] for k in KINDS], dtype=np.int64)
    every = [dict(zip(KINDS, map(int, row))) for row in all_gather_ragged(group, mine)]
    return float(np.median(times[1:])), every


def runnable(config, batch, microbatches):
    """The layouts of LAYOUTS this config and batch can take (tp divides the heads, a block
    per stage, the batch splits into dp·m micro-batches)."""
    return [(dp, tp, pp, zero) for dp, tp, pp, zero in LAYOUTS
            if config.n_head % tp == 0 and pp <= config.n_layer and batch % (dp * microbatches) == 0]


def worker(config_name, batch, microbatches, steps, repeats):
    """Sweep the layouts `repeats` times (interleaved, so a slow spell of the machine hits
    every layout alike); rank 0 prints one JSON line per layout and sweep."""
    group, config = world(), get_config(config_name)
    if group.size != RANKS:
        raise ValueError(f"the validation worker needs {RANKS} ranks, got {group.size}")
    for _ in range(repeats):
        for layout in runnable(config, batch, microbatches):
            seconds, memory = run_layout(group, config, layout, batch, microbatches, steps)
            if group.rank == 0:
                print(json.dumps({"layout": layout, "seconds": seconds, "memory": memory}), flush=True)


def merge_sweeps(lines):
    """One result per layout: the median of its sweeps' seconds, and their range."""
    by_layout = {}
    for line in lines:
        by_layout.setdefault(tuple(line["layout"]), []).append(line)
    return [{"layout": list(layout), "memory": runs[0]["memory"],
             "seconds": float(np.median([r["seconds"] for r in runs])),
             "spread": (min(r["seconds"] for r in runs), max(r["seconds"] for r in runs))}
            for layout, runs in by_layout.items()]


def measure(config_name, batch, microbatches, steps, repeats, timeout):
    try:
        output = run_on_mpi_ranks(RANKS, "parallel.plan.validate", "--worker", "--config", config_name,
                                  "--batch", batch, "--microbatches", microbatches, "--steps", steps,
                                  "--repeats", repeats, timeout=timeout)
    except RuntimeError as error:
        raise SystemExit(f"python -m parallel.plan.validate: {error}") from None
    return merge_sweeps([json.loads(line) for line in output.splitlines() if line.startswith("{")])


def ranks(values):
    """1-based rank of each value (ties share the mean rank)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(a, b):
    """Pearson correlation of the ranks."""
    ra, rb = ranks(a), ranks(b)
    mean = (len(a) + 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb))
    var = (sum((x - mean) ** 2 for x in ra) * sum((y - mean) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def kendall(a, b):
    """(concordant − discordant) / pairs, over all pairs (tau-a)."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    sign = lambda x: (x > 0) - (x < 0)
    return sum(sign(a[i] - a[j]) * sign(b[i] - b[j]) for i, j in pairs) / len(pairs)


def memory_errors(config, results):
    """[(layout name, rank, kind, measured, predicted, relative error)] for every rank."""
    rows = []
    for result in results:
        dp, tp, pp, zero = result["layout"]
        balance = balance_of(config, pp)
        for rank, measured in enumerate(result["memory"]):
            coords = (rank // tp % dp, rank % tp, rank // (tp * dp))
            predicted = param_bytes_per_rank(config, dp, tp, pp, coords, "float32", zero, balance)
            for kind in KINDS:
                error = abs(measured[kind] - predicted[kind]) / predicted[kind]
                rows.append((layout_name(dp, tp, pp, zero), rank, kind, measured[kind], predicted[kind], error))
    return rows


def report_memory(config, results):
    rows = memory_errors(config, results)
    worst = max(rows, key=lambda row: row[-1])
    print(f"memory: {len(rows)} figures (params, grads, optim on every rank of {len(results)} layouts); "
          f"largest relative error {worst[-1]:.2%} ({worst[0]} rank {worst[1]} {worst[2]}: "
          f"measured {worst[3]} B, predicted {worst[4]} B)")
    return rows


def report_time(config, batch, microbatches, profile, results):
    predicted = [estimate(config, Layout(dp, tp, pp, microbatches, zero=zero), batch, profile).time["total"]
                 for dp, tp, pp, zero in (r["layout"] for r in results)]
    measured = [r["seconds"] for r in results]
    predicted_rank, measured_rank = ranks(predicted), ranks(measured)
    print(f"\nstep time, {config} batch {batch}, m={microbatches}, profile {profile['name']}:")
    print(f"{'layout':<18}{'predicted s':>12}{'measured s':>12}{'(min-max of sweeps)':>22}{'pred rank':>10}"
          f"{'meas rank':>10}")
    for r, p, m, pr, mr in zip(results, predicted, measured, predicted_rank, measured_rank):
        spread = f"({r['spread'][0]:.3g}-{r['spread'][1]:.3g})"
        print(f"{layout_name(*r['layout']):<18}{p:>12.4g}{m:>12.4g}{spread:>22}{pr:>10g}{mr:>10g}")
    print(f"Spearman rho = {spearman(predicted, measured):+.3f}, Kendall tau = {kendall(predicted, measured):+.3f}")
    return predicted, measured


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m parallel.plan.validate", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="medium", help="named model config (default medium)")
    parser.add_argument("--batch", type=int, help="global batch (default: the config's usual one)")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="sweeps over the layouts (median taken)")
    parser.add_argument("--device", action="append", help="profile(s) to predict with (repeatable; "
                        "default laptop-cpu)")
    parser.add_argument("--calibrate", action="store_true", help="measure this machine first and also "
                        "predict with that profile")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    batch = args.batch or DEFAULT_BATCH[args.config]
    if args.worker:
        return worker(args.config, batch, args.microbatches, args.steps, args.repeats)
    profiles = [load_profile(name) for name in args.device or ["laptop-cpu"]]
    if args.calibrate:
        from .calibrate import calibrate
        profiles.append(calibrate())
    results = measure(args.config, batch, args.microbatches, args.steps, args.repeats, args.timeout)
    config = get_config(args.config)
    report_memory(config, results)
    for profile in profiles:
        report_time(config, batch, args.microbatches, profile, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
