"""Which pipeline schedule the GPU-cluster planner picks for GPT-3 175B on 1024 A100s (tp 8 × pp 16 × dp 8).

    python tutorials/22_dualpipe/planner_picks.py

For each recomputation mode and memory size, every schedule at its fastest fitting micro-batch size and
interleaving (parallel.plan.cluster_search.best_steps), fastest first: the step, its bubble, the memory per
GPU. The same search runs under `python -m parallel.plan ... --layout tp=8,pp=16,dp=8 --schedule any`.
"""
from parallel.plan import load_profile
from parallel.plan.cluster_search import best_steps
from parallel.plan.dual import DUAL
from parallel.plan.model import CONFIGS

GPT3 = CONFIGS["gpt3-175b"]
BATCH = 1536


def best_of_each(profile, recompute):
    """{schedule name: its fastest fitting step} (interleaved 1F1B named by its v)."""
    best = {}
    for st in best_steps(GPT3, profile, 1024, BATCH, tp=8, pp=16, recompute=recompute, schedule=None):
        name = st.schedule if st.schedule in DUAL else "1f1b" if st.chunks == 1 else f"interleaved v={st.chunks}"
        if st.fits:
            best.setdefault(name, st)
    return best


def main():
    a100 = load_profile("a100-80gb")
    for recompute, gib in (("full", 80), ("selective", 80), ("selective", 60)):
        best = best_of_each({**a100, "memory_gib": gib}, recompute)
        print(f"{recompute} recomputation, {gib} GiB per GPU:")
        for name, st in sorted(best.items(), key=lambda item: item[1].seconds["step"])[:4]:
            print(f"  {name:<16} step {st.seconds['step']:6.2f} s  bubble {st.seconds['bubble']:5.3f} s  "
                  f"memory {st.memory['total'] / 2**30:5.1f} GiB  micro-batch {st.micro_batch}")
        print(f"  picked: {min(best, key=lambda name: best[name].seconds['step'])}")


if __name__ == "__main__":
    main()
