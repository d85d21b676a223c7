"""The search over a GPU cluster's layouts (plan.cluster): every runnable (t, p, d, b, v, DDP), fastest first.

Megatron-LM 2021 can run a layout without pipelining under PyTorch's DDP (--DDP-impl torch), which
hides the dp all-reduce behind the backward (cluster.ddp_seconds); its own DDP (local) the rest. The
search tries both where both can run, as a user choosing the flag would.
"""
from .cluster import DDP, figures, layout_error, step
from .stage_split import SPLITS


def best_steps(config, profile, devices, batch, tp=None, pp=None, dp=None, b=None, v=None, max_micro_batch=16,
               recompute="full", sequence_parallel=False, ddp=None, split=None):
    """Every runnable layout matching the given parts (None: search it), fastest first, fitting ones
    before the rest; with none given, the search over t ≤ GPUs per node, every p, b ≤ max_micro_batch, v,
    DDP and (v = 1) the split of the blocks into stages, even or balanced (stage_split.py)."""
    gpu = figures(profile)
    found = []
    for t in [tp] if tp else [x for x in range(1, gpu["gpus_per_node"] + 1) if devices % x == 0]:
        for p in [pp] if pp else [x for x in range(1, config.n_layer + 1) if (devices // t) % x == 0]:
            d = dp or devices // (t * p)
            for micro in [b] if b else [x for x in range(1, max_micro_batch + 1) if batch % (d * x) == 0]:
                for chunks in [v] if v else [x for x in range(1, config.n_layer // p + 1) if x == 1 or p > 1]:
                    for kind in [ddp] if ddp else DDP:
                        mode = (recompute, sequence_parallel, kind)
                        if layout_error(config, devices, batch, t, p, d, micro, chunks, gpu["gpus_per_node"],
                                        *mode) is None:
                            cuts = [split] if split else SPLITS if chunks == 1 else ["even"]
                            found += distinct_splits(step(config, profile, batch, t, p, d, micro, chunks, *mode, cut)
                                                     for cut in cuts)
    return sorted(found, key=lambda st: (not st.fits, st.seconds["step"]))


def distinct_splits(steps):
    """The steps of one layout, one per distinct split of its blocks (even and balanced often agree)."""
    return list({tuple(st.split): st for st in steps}.values())


def with_micro_batches(st, batch):
    out = st.as_json()
    out["layout"]["micro_batches"] = batch // (st.dp * st.micro_batch)
    return out
