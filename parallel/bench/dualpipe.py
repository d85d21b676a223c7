"""DeepSeek-V3's table 2 (bubble, parameters, activations per device), simulated and executed.

    python -m parallel.bench dualpipe [--stages 8] [--microbatches 20] [--costs F,B,W ...]

PP stages of equal cost: 1F1B and ZB1P (zb-h1) on PP ranks, one stage each; DualPipe on PP ranks,
each holding two stages, its own and the mirrored copy of another (m/2 micro-batches each way);
DualPipeV on PP/2 ranks, two stages each (pipeline.dualpipe). For each (F, B, W) — B the whole backward, W its
weight part, so the input part is B - W — the checker's simulation of the schedules' own lists
gives each rank's idle time (makespan - its work), printed beside the report's formula:
    1F1B       (PP-1)(F+B)
    ZB1P       (PP-1)(F+B-2W)
    DualPipe   (PP/2-1)(F&B+B-3W),  F&B = F + B here: on a CPU the pair runs in sequence
    DualPipeV  (PP/2-1)(F&B+B-3W)
1F1B's formula holds at any costs. ZB1P's holds at its design point F = B - W = W; DualPipe's and
DualPipeV's where the input part equals the forward and W fits in its gaps (B - W = F >= W), with m
large enough to reach the steady state (m >= 3·PP - 4 for DualPipe, 3·PP/2 - 2 for the V; with fewer,
the short steady state idles less than the formula). Away from those points the simulation of the same lists
idles longer, and the table shows by how much.
Parameters and activations per device come from an executed step (threads, a float64 GPT of PP
blocks): parameters relative to 1F1B's largest rank; activations the peak (micro-batch, stage)
graphs a rank held (the report's PP and PP+1) and their bytes from the meter of the run. DualPipe
holds 2x the parameters (stage i and the mirrored copy of stage PP-1-i; the copies' gradients are
summed, pipeline.tied).
"""
import sys

from minitensor.bench_cli import bench_parser, run_bench
from minitensor.flags import AT_LEAST_1

SCHEDULES = (("1F1B", "1f1b"), ("ZB1P", "zb-h1"), ("DualPipe", "dualpipe"), ("DualPipeV", "dualpipev"))


def formula(name, pp, forward, backward, weight):
    """Idle time per device, DeepSeek-V3 table 2 (F&B = F + B: no overlap)."""
    return {"1f1b": (pp - 1) * (forward + backward), "zb-h1": (pp - 1) * (forward + backward - 2 * weight),
            "dualpipe": (pp // 2 - 1) * (forward + backward + backward - 3 * weight),
            "dualpipev": (pp // 2 - 1) * (forward + backward + backward - 3 * weight)}[name]


def simulated_idle(name, pp, m, forward, backward, weight):
    """Idle time per device of the schedule's list, simulated at these costs."""
    from parallel.pipeline import Timeline, check_schedule, get_schedule, placement_of
    from parallel.pipeline.schedules import COMPUTE_KINDS

    ranks, chunks = layout(name, pp)
    report = check_schedule(get_schedule(name, ranks, m, chunks), ranks, m, chunks, forward_time=forward,
                            backward_time=backward, weight_time=weight, placement=placement_of(name))
    busy = max(sum(e.end - e.start for e in report.events if e.rank == r and e.kind in COMPUTE_KINDS)
               for r in range(ranks))
    return Timeline(report.events, ranks).makespan - busy


def layout(name, pp):
    """(ranks, chunks per rank) for PP stages' worth of pipeline under schedule `name`."""
    return {"dualpipev": (pp // 2, 2), "dualpipe": (pp, 2)}.get(name, (pp, 1))


def executed(name, pp, m):
    """(parameters, peak stored graphs, peak bytes) of the largest rank, from one executed step."""
    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig
    from parallel.pipeline import placement_of
    from parallel.pipeline.partition import stages_for_rank

    ranks, chunks = layout(name, pp)
    config = GPTConfig(vocab_size=16, block_size=8, n_layer=pp, n_head=2, d_model=16)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 16, (2 * m, 8))

    def step():  # memory only: DualPipe's copies' gradients are not summed here (HybridGPT does it)
        mt.manual_seed(0)
        group = parallel.world()
        stages = stages_for_rank(GPT(config).double(), group.rank, ranks, chunks, placement=placement_of(name))
        pipe = parallel.Pipeline(stages, group, m, name)
        pipe.train_step(idx, idx)
        return sum(p.size for p in pipe.parameters()), pipe.peak_activations, pipe.peak_activation_bytes

    return [max(column) for column in zip(*parallel.run_threads(ranks, step, timeout=120))]


def cost_triple(text):
    """'1,2,1' -> (F, B, W), or None unless F, W > 0 and B > W (a backward holds its W and more)."""
    try:
        forward, backward, weight = (float(x) for x in text.split(","))
    except ValueError:
        return None
    return (forward, backward, weight) if forward > 0 and backward > weight > 0 else None


def main(argv):
    parser = bench_parser("python -m parallel.bench dualpipe", __doc__, blas_threads=False)
    parser.add_argument("--stages", type=int, default=8, help="pipeline stages PP (even; default 8)")
    parser.add_argument("--microbatches", type=int, default=20, help="micro-batches m (even, ≥ 2·PP; default 20)")
    parser.add_argument("--costs", nargs="+", default=["1,2,1", "2,3,1", "1,2,0.5", "1,3,1"],
                        help="F,B,W triples (B the whole backward)")
    return run_bench(parser, argv, run, {"stages": AT_LEAST_1, "microbatches": AT_LEAST_1})


def run(args):
    pp, m = args.stages, args.microbatches
    costs = [cost_triple(triple) for triple in args.costs]
    error = (f"--stages {pp} must be even and --microbatches {m} even and at least 2·PP (DualPipe's m/2 each way)"
             if pp % 2 or m % 2 or m < 2 * pp else next((f"--costs {t}: give F,B,W, three numbers with F, W > 0 and B > W"
                                            for t, c in zip(args.costs, costs) if c is None), None))
    if error:
        print(f"python -m parallel.bench dualpipe: error: {error}", file=sys.stderr)
        return 2
    print(f"PP = {pp} stages of equal cost, m = {m}; idle time per device: simulated / formula")
    print(f"{'method':<10} {'devices':>7} " + " ".join(f"{'F,B,W=' + t:>17}" for t in args.costs)
          + f" {'params':>7} {'act. (graphs, bytes)':>22}")
    base = None
    for title, name in SCHEDULES:
        params, graphs, nbytes = executed(name, pp, m)
        base = base or params
        idle = " ".join(f"{simulated_idle(name, pp, m, *c):>8g} / {formula(name, pp, *c):<6g}" for c in costs)
        devices = layout(name, pp)[0]
        print(f"{title:<10} {devices:>7} {idle} {params / base:>6.2f}x {graphs:>10} {nbytes:>11,}")
    return 0
