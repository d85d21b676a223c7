"""Chapter 10, part 1: ask the planner about a laptop, a GPU node and GPT-3 on 1024 A100s.

    python tutorials/10_planner/plan_three_machines.py

The planner is a pure cost model (no ranks, no training), so this is a single-process
program; under mpiexec only rank 0 prints. It runs `python -m parallel.plan`'s own
main() three times and prints its tables, then, for GPT-3 175B, where a Megatron-style
layout (tp 8 inside a node, pp 8 across nodes, dp 16 for the rest: a representative
choice, not a quoted row of a paper's table) lands in the ranking, and the step time
that the planner's figures add up to.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from parallel.launch import launched_by_mpiexec
from parallel.plan import Layout, estimate, get_config, load_profile, plan
from parallel.plan.__main__ import main as plan_cli

QUESTIONS = [
    ("a laptop: the medium GPT on 2 CPU cores", ["--config", "medium", "--devices", "2", "--device", "laptop-cpu"]),
    ("a GPU node: a 13-billion-parameter GPT (GPT-3 13B shape) on 8 A100-80GB",
     ["--n-layer", "40", "--d-model", "5120", "--n-head", "40", "--vocab", "50257", "--seq", "2048",
      "--devices", "8", "--device", "a100-80gb", "--batch", "64"]),
    ("a large model: GPT-3 175B on 1024 A100-80GB, global batch 1536",
     ["--config", "gpt3-175b", "--devices", "1024", "--device", "a100-80gb", "--batch", "1536", "--explain", "1"]),
]
MEGATRON_STYLE = dict(dp=16, tp=8, pp=8)  # tp within a node, pp across nodes, as Narayanan et al. 2021 advise


def megatron_style_layout():
    """Where the Megatron-style GPT-3 layout ranks among everything the planner tried."""
    config, profile = get_config("gpt3-175b"), load_profile("a100-80gb")
    result = plan(config, 1024, 1536, profile, dtype="mixed")
    for position, est in enumerate(result.ranked, 1):
        if (est.layout.dp, est.layout.tp, est.layout.pp) == tuple(MEGATRON_STYLE.values()):
            break
    print(f"\nthe Megatron-style layout dp{MEGATRON_STYLE['dp']}·tp{MEGATRON_STYLE['tp']}·pp{MEGATRON_STYLE['pp']}: "
          f"best variant ranks "
          f"{position} of {len(result.ranked)} fitting layouts "
          f"(m={est.layout.micro_batches}, flags {est.layout.flags()}), step {est.time['total']:.4g} s "
          f"vs the best {result.ranked[0].time['total']:.4g} s")
    plain = estimate(config, Layout(**MEGATRON_STYLE, micro_batches=est.layout.micro_batches), 1536, profile, "mixed")
    print(f"the same grid without its flags needs {plain.memory['total'] / 2**30:.3g} GiB per GPU "
          f"(activations {plain.memory['activations'] / 2**30:.3g} GiB)")


def main():
    for title, argv in QUESTIONS:
        print(f"\n=== {title}\n$ python -m parallel.plan {' '.join(argv)} --top 5")
        plan_cli(argv + ["--top", "5"])
    megatron_style_layout()


if __name__ == "__main__":
    if not launched_by_mpiexec():
        main()
    else:
        from parallel import world
        if world().rank == 0:
            main()
