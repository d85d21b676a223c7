"""Context parallelism on a long sequence: cp = 1, 2, 4 (4 oversubscribes a 2-core laptop).

    python -m parallel.bench cp [--layouts 1 2 2c 2u 4 4c 4u] [--steps 3] [--warmup 1]

The model: a small GPT (d_model 64, 4 heads, 2 layers, vocab 64) on sequences of 1024
tokens, batch 2, float32, AdamW, causal. Layouts: cp ranks, ring attention over the zigzag
split by default, "c" over the contiguous split, "u" Ulysses (two all-to-alls, zigzag). Each runs under mpiexec with ONE BLAS thread per rank. Printed per layout:

    step time     median over steps of the slowest rank's train_step + optimizer step
    activations   peak bytes of saved activations per rank, measured (the pipeline's meter:
                  every array the graph keeps for backward, logits included) | the planner's
                  formula (parallel.plan.memory, which leaves the logits out; for Ulysses the
                  dense figure / cp); measured cp=1 / this
    work min/max  the causal attention pairs each rank computed (ContextParallel.work): the
                  least-loaded rank's over the busiest's; 1.00 is perfect balance, the
                  contiguous split gives 1/(2·cp−1) for long sequences
    cp bytes      what one rank sent in the cp group per step, measured | the formula:
                  layout.ring_elements (ring) or all_to_all_elements (Ulysses) × layers × 4 bytes
"""
import argparse

from minitensor.bench_cli import bench_parser, run_bench, threads_note
from minitensor.bench_timing import timed_calls
from parallel.bench import report, run_layouts, slowest_median, together

CONFIG = dict(vocab_size=64, block_size=1024, n_layer=2, n_head=4, d_model=64)
BATCH = 2
LAYOUTS = {"1": (1, "zigzag", "p2p"), "2": (2, "zigzag", "p2p"), "2c": (2, "contiguous", "p2p"),
           "2u": (2, "zigzag", "a2a"), "4": (4, "zigzag", "p2p"), "4c": (4, "contiguous", "p2p"),
           "4u": (4, "zigzag", "a2a")}


def formula_activation_bytes(cp, comm_type):
    """The planner's figure (which models the ring). Ulysses keeps the s×s probabilities of
    its H/cp heads for all s tokens, and s/cp of every other activation: the dense figure / cp."""
    from parallel.plan import GPTConfig, Layout, activation_bytes_per_rank
    if comm_type == "a2a":
        return activation_bytes_per_rank(GPTConfig(**CONFIG), Layout(), BATCH, 0) / cp
    return activation_bytes_per_rank(GPTConfig(**CONFIG), Layout(cp=cp), BATCH, 0)


def formula_cp_bytes(cp, comm_type, word=4):
    from parallel.context_parallel import all_to_all_elements, ring_elements
    elements = all_to_all_elements if comm_type == "a2a" else ring_elements
    per_layer = elements(BATCH, CONFIG["block_size"], CONFIG["d_model"], cp)
    return CONFIG["n_layer"] * (per_layer["forward"] + per_layer["backward"]) * word


def main(argv):
    parser = bench_parser("python -m parallel.bench cp", __doc__, steps=3, warmup=1)
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS),
                        help="cp sizes to run; c = the contiguous split, u = Ulysses (default: all)")
    parser.add_argument("--worker", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    return run_bench(parser, argv, run)


def run(args):
    if args.worker:
        return run_worker(*LAYOUTS[args.worker], args.steps, args.warmup)
    print(f"GPT {CONFIG}, batch {BATCH}, causal, float32, AdamW; {threads_note(args)}")
    print_table(run_layouts("cp", args.layouts, {layout: LAYOUTS[layout][0] for layout in args.layouts}, args))
    return 0


def print_table(results):
    mib = 2 ** 20
    base = results[0]
    print(f"{'cp':>3} {'layout':>10} {'comm':>5} {'step time':>10} {'vs first':>8}  {'activations/rank MiB':>27}  "
          f"{'work min/max':>12}  {'cp MiB/step (measured | formula)':>34}")
    for r in results:
        formula = formula_activation_bytes(r["cp"], r["comm"])
        activations = (f"{r['activation_bytes'] / mib:7.2f} | {formula / mib:6.2f} "
                       f"(/{base['activation_bytes'] / r['activation_bytes']:.2f})")
        print(f"{r['cp']:>3} {r['layout']:>10} {r['comm']:>5} {r['step_s']:>8.3f} s {base['step_s'] / r['step_s']:>7.2f}x  "
              f"{activations:>27}  {min(r['work']) / max(r['work']):>12.2f}  "
              f"{r['cp_bytes'] / mib:>16.3f} | {formula_cp_bytes(r['cp'], r['comm']) / mib:.3f}")


def run_worker(cp, layout, comm_type, steps, warmup):
    import numpy as np

    import minitensor as mt
    import parallel
    from minitensor.models import GPT, GPTConfig

    world = parallel.world()
    if world.size != cp:
        raise ValueError(f"cp benchmark worker for cp={cp} launched on {world.size} ranks")
    mt.manual_seed(0)
    model = parallel.HybridGPT(GPT(GPTConfig(**CONFIG)), parallel.Mesh(cp=cp), cp_layout=layout,
                               cp_comm_type=comm_type)
    model.configure_optimizer(lr=3e-4)
    rng = np.random.default_rng(0)
    shape = (BATCH, CONFIG["block_size"])

    def batch():
        idx, targets = rng.integers(0, CONFIG["vocab_size"], shape), rng.integers(0, CONFIG["vocab_size"], shape)
        model.reset_communication_stats()
        if model.context is not None:
            model.context.reset_work()
        return idx, targets

    sent = {}

    def step(idx, targets):
        model.train_step(idx, targets)
        sent["bytes"] = model.communication_stats().get(("cp", "send"), {"bytes": 0})["bytes"]
        model.optimizer_step()

    step_s = slowest_median(world, timed_calls(step, steps, warmup, before=together(world, batch)))
    work = model.context.work if model.context is not None else 0
    works = world.all_gather(np.array([work], dtype=np.int64))
    if world.rank == 0:
        report({"cp": cp, "layout": layout if cp > 1 else "-", "comm": comm_type if cp > 1 else "-",
                "step_s": step_s,
                "activation_bytes": int(model.pipeline.peak_activation_bytes), "cp_bytes": int(sent["bytes"]),
                "work": [int(w) for w in works] if cp > 1 else [1]})
    return 0
