"""The search over a GPU cluster's layouts (plan.cluster): every runnable (t, p, d, b, v, DDP), fastest first.

Megatron-LM 2021 can run a layout without pipelining under PyTorch's DDP (--DDP-impl torch), which
hides the dp all-reduce behind the backward (cluster.ddp_seconds); its own DDP (local) the rest. The
search tries both where both can run, as a user choosing the flag would.
"""
from collections import Counter
from itertools import product

from .cluster import DDP, SCHEDULES, figures, layout_error, step
from .search import check_search_size
from .stage_split import SPLITS

# Checking and costing one cluster layout takes ≈ 110 µs on a laptop core (measured over the
# 6,316 layouts of gpt3-175b on 3,072 GPUs), 250 of the layout search's ≈ 0.4 µs steps: the
# cluster search is refused by the same bound as the search (search.MAX_SEARCH_STEPS).
STEPS_PER_LAYOUT = 250


def grids(config, gpu, devices, tp=None, pp=None, dp=None):
    """The (t, p, d) the search visits: t ≤ GPUs per node dividing devices, every p ≤ n_layer dividing the rest."""
    for t in [tp] if tp else [x for x in range(1, gpu["gpus_per_node"] + 1) if devices % x == 0]:
        for p in [pp] if pp else [x for x in range(1, config.n_layer + 1) if (devices // t) % x == 0]:
            yield t, p, dp or devices // (t * p)


def best_steps(config, profile, devices, batch, tp=None, pp=None, dp=None, b=None, v=None, max_micro_batch=16,
               recompute="full", sequence_parallel=False, ddp=None, split=None, schedule="1f1b"):
    """Every runnable layout matching the given parts (None: search it), fastest first, fitting ones
    before the rest; with none given, the search over t ≤ GPUs per node, every p, b ≤ max_micro_batch, v,
    DDP and (v = 1) the split of the blocks into stages, even or balanced (stage_split.py). schedule: 1f1b
    (Megatron-LM's, interleaved for v > 1), dualpipe or dualpipev (v = 1), or None: all three."""
    gpu = figures(profile)
    candidates = []
    for t, p, d in grids(config, gpu, devices, tp, pp, dp):
        micros = [b] if b else [x for x in range(1, max_micro_batch + 1) if batch % (d * x) == 0]
        chunks = [v] if v else [1] if p == 1 else range(1, config.n_layer // p + 1)
        candidates.append((t, p, d, micros, chunks))
    kinds = [ddp] if ddp else DDP

    def cuts(chunk):  # the splits of the blocks tried: the one given, else both where v = 1
        return [split] if split else SPLITS if chunk == 1 else ["even"]

    def schedules(chunk):  # DualPipe(V) hold their two stages per rank their own way: v = 1
        return [schedule] if schedule else SCHEDULES if chunk == 1 else ["1f1b"]
    check_search_size(sum(len(m) * sum(len(cuts(c)) * len(schedules(c)) for c in cs) for *_, m, cs in candidates)
                      * len(kinds) * STEPS_PER_LAYOUT)
    found = []
    for t, p, d, micros, chunks in candidates:
        for micro in micros:
            for chunk in chunks:
                for kind, name in product(kinds, schedules(chunk)):
                    mode = (recompute, sequence_parallel, kind)
                    if layout_error(config, devices, batch, t, p, d, micro, chunk, gpu["gpus_per_node"],
                                    *mode, name) is None:
                        found += distinct_splits(step(config, profile, batch, t, p, d, micro, chunk, *mode, cut, name)
                                                 for cut in cuts(chunk))
    return sorted(found, key=lambda st: (not st.fits, st.seconds["step"]))


def why_none_runs(config, profile, devices, batch):
    """The commonest reasons no (t, p, d) of the search runs, each with its count (micro-batch 1, v 1)."""
    gpu = figures(profile)
    reasons = Counter(layout_error(config, devices, batch, t, p, d, 1, 1, gpu["gpus_per_node"])
                      for t, p, d in grids(config, gpu, devices))
    return ", ".join(f"{count} with {why}" for why, count in reasons.most_common(3) if why)


def distinct_splits(steps):
    """The steps of one layout, one per distinct split of its blocks (even and balanced often agree)."""
    return list({tuple(st.split): st for st in steps}.values())


def with_micro_batches(st, batch):
    out = st.as_json()
    out["layout"]["micro_batches"] = batch // (st.dp * st.micro_batch)
    return out
