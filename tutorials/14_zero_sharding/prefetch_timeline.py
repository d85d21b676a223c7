"""Chapter 14, part 2: ZeRO-3's all-gathers on the timeline, without and with prefetch.

    python tutorials/14_zero_sharding/prefetch_timeline.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/14_zero_sharding/prefetch_timeline.py

One training step of a ZeRO-3 GPT on the dp ranks, twice: prefetch 0 (each unit's
all-gather issued when the unit is needed) and prefetch 1 (the next unit's issued
before this one computes). Prints the step's gathers as data (the schedule), rank 0's
timeline (gather issued, gather waited for, unit forward), how many gathers were
issued before the unit before them started computing, and the peak bytes of gathered
units next to (1 + prefetch) × the largest unit.
"""
import parallel
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, d_model=64)


def one_step(group, prefetch):
    mt.manual_seed(0)
    model = parallel.HybridGPT(GPT(CONFIG), parallel.Mesh(group.size, 1, 1, world=group), zero=3, prefetch=prefetch)
    model.configure_optimizer()
    idx = np.random.default_rng(group.rank).integers(0, CONFIG.vocab_size, (4 * group.size, CONFIG.block_size))
    model.train_step(idx, idx)  # the first step records the order of the units; the second is shown
    model.optimizer_step()
    sharding = model.replicas.shardings[0]
    sharding.reset_peak()
    model.train_step(idx, idx)
    model.optimizer_step()
    largest = max(unit.full_bytes for unit in sharding.units)
    return sharding.schedule(), sharding.events, sharding.peak_gathered_bytes, largest


def issued_ahead(events):
    """Forward gathers issued before the unit in front of them began its forward."""
    starts = [(t0, unit) for kind, unit, t0, _ in events if kind == "F"]
    issues = {unit: t0 for kind, unit, t0, _ in events if kind == "gather-forward-issue"}
    return sum(issues[unit] < previous_start for (previous_start, _), (_, unit) in zip(starts, starts[1:])), \
        len(starts) - 1


def timeline(events):
    lines = []
    for kind, unit, t0, t1 in events:
        if kind == "F":
            lines.append(f"  {t0 * 1e3:8.2f} ms  compute  forward {unit:<9} until {t1 * 1e3:8.2f} ms")
        elif kind.endswith("-issue"):
            lines.append(f"  {t0 * 1e3:8.2f} ms  comm     all-gather {unit} issued ({kind.split('-')[1]})")
        else:
            lines.append(f"  {t0 * 1e3:8.2f} ms  comm     waited for {unit} until {t1 * 1e3:8.2f} ms "
                         f"({kind.split('-')[1]})")
    return lines


def main(args):
    group = parallel.world()
    runs = {prefetch: one_step(group, prefetch) for prefetch in (0, 1)}
    if group.rank != 0:
        return
    print(parallel.launch.launch_report(group))
    schedule = runs[1][0]
    print(f"the step's all-gathers as data ({len(schedule)} per step, each unit twice): "
          + ", ".join(f"{phase[0].upper()}:{unit}" for phase, unit in schedule))
    for prefetch, (_, events, peak, largest) in runs.items():
        ahead, total = issued_ahead(events)
        print(f"\nprefetch {prefetch}: rank 0's step")
        print(*timeline(events), sep="\n")
        print(f"prefetch {prefetch}: forward gathers issued before the previous unit computed: {ahead} of {total}")
        print(f"prefetch {prefetch}: peak gathered bytes {peak:,}; (1 + {prefetch}) x largest unit "
              f"{largest:,} = {(1 + prefetch) * largest:,}")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
