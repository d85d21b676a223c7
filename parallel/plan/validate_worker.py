"""The validation's worker: one mpiexec job trains every layout and measures what the
step-time simulation needs, on all ranks at once (python -m parallel.plan.validate runs it
and reads its JSON lines; see validate.py).

Per sweep: the link between ranks 0 and 1 (a ping-pong), how much faster a rank computes
alone (shared_cores), the all-reduce on groups of each size the layouts form, the per-part
costs of every micro-batch size and tp (parts.py), then every layout's median step time
and every rank's parameter, gradient and optimizer bytes.
"""
import dataclasses
import json
import time

import numpy as np

import minitensor as mt
from minitensor.allocator import keep_freed_memory
from minitensor.models import gpt as dense

from ..comm import world
from ..comm.gather import all_gather_ragged
from ..hybrid import HybridGPT
from ..mesh import Mesh
from .calibrate import ping_pong_seconds
from .dual import DUAL, dual_error, stage_count
from .model import get_config
from .parts import measure_parts
from .simulate import PartCosts

# (dp, tp, pp, ZeRO stage, activation recomputation[, pipeline schedule: default 1f1b])
LAYOUTS = {4: [(4, 1, 1, 0, False), (2, 2, 1, 0, False), (2, 1, 2, 0, False), (1, 2, 2, 0, False),
               (1, 4, 1, 0, False), (1, 1, 4, 0, False), (2, 2, 1, 1, False), (2, 1, 2, 2, False),
               (4, 1, 1, 3, False), (4, 1, 1, 0, True), (1, 1, 4, 0, True), (1, 2, 2, 0, True)],
           2: [(2, 1, 1, 0, False), (1, 2, 1, 0, False), (1, 1, 2, 0, False), (2, 1, 1, 1, False),
               (2, 1, 1, 3, False), (2, 1, 1, 0, True), (1, 2, 1, 0, True), (1, 1, 2, 0, True),
               (1, 1, 2, 0, False, "zb-h1"), (1, 1, 2, 0, False, "dualpipev")]}
KINDS = ("params", "grads", "optim")


def measure_memory(model):
    """{"params", "grads", "optim"} bytes this rank holds (HybridGPT.memory_bytes: live arrays):
    local parameters or their ZeRO-3 shards, their gradients or ZeRO-2/3 shards (call after
    the gradient sync, before the optimizer zeroes them), the optimizer's state; under a
    mixed precision policy the float32 masters count as optimizer state and their gradients
    as gradients."""
    held = model.memory_bytes()
    return {kind: held[kind] for kind in KINDS}


def unpack(layout):
    """(dp, tp, pp, zero, recompute, schedule) of a layout tuple (files saved before recomputation or
    schedules were measured hold four or five entries: no recomputation, 1F1B)."""
    dp, tp, pp, zero, *rest = layout
    return dp, tp, pp, int(zero), bool(rest and rest[0]), rest[1] if len(rest) > 1 else "1f1b"


def dense_gpt(config):
    """The float32 minitensor GPT of a planner config, seeded alike on every rank."""
    mt.manual_seed(0)
    return dense.GPT(config, dtype=np.float32)  # the planner's GPTConfig is the model's


def run_layout(group, config, layout, batch, microbatches, steps):
    """Worker side: train one layout; ([seconds of each timed step], [memory of every rank])."""
    dp, tp, pp, zero, recompute, schedule = unpack(layout)
    model = HybridGPT(dense_gpt(config), Mesh(dp, tp, pp, world=group), microbatches=microbatches, zero=zero,
                      recompute_activations=recompute, schedule=schedule, chunks=stage_count(schedule, pp) // pp)
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
    return times[1:], every  # the first step is a warm-up


def runnable(config, batch, microbatches, ranks=4):
    """The layouts of LAYOUTS[ranks] this config and batch can take (tp divides the heads, a
    block per stage, the batch splits into dp·m micro-batches, DualPipe(V) has its m ≥ 2·pp)."""
    if ranks not in LAYOUTS:
        raise ValueError(f"the validation knows layouts of {sorted(LAYOUTS)} ranks, not {ranks}")
    return [layout for layout in LAYOUTS[ranks] if can_run(config, batch, microbatches, *unpack(layout))]


def can_run(config, batch, m, dp, tp, pp, zero, recompute, schedule):
    dual = schedule in DUAL and dual_error(schedule, pp, m, config.n_layer)
    return config.n_head % tp == 0 and stage_count(schedule, pp) <= config.n_layer and batch % (dp * m) == 0 and not dual


def measure_parts_on_every_rank(group, config, b, tp):
    """PartCosts of (b, tp) measured on every rank at once, averaged over the ranks."""
    parts = measure_parts(config, b, tp)
    flat = np.array([*parts.embed, *parts.block, *parts.head, parts.optimizer_per_param])
    flat = group.all_reduce(flat) / group.size
    return PartCosts(tuple(flat[0:2]), tuple(flat[2:4]), tuple(flat[4:6]), float(flat[6]))


def measure_link(group):
    """{"alpha_us", "bandwidth_gbps"} between ranks 0 and 1 by calibrate's ping-pong (the other
    ranks wait at its barriers)."""
    large = 8 * 2**20
    if group.rank > 1:
        group.barrier()
        group.barrier()
        return None
    alpha = ping_pong_seconds(group, 8, repeats=200)
    one_way = ping_pong_seconds(group, large, repeats=5)
    return {"alpha_us": alpha * 1e6, "bandwidth_gbps": large / max(one_way - alpha, 1e-12) / 1e9}


def all_reduce_seconds(group, nbytes, repeats):
    """Median over `repeats` of the slowest rank's time for an all-reduce of nbytes."""
    buf, times = np.zeros(max(1, nbytes // 4), dtype=np.float32), []
    for _ in range(repeats + 1):                     # the first is a warm-up
        group.barrier()
        start = time.perf_counter()
        group.all_reduce(buf)
        times.append(time.perf_counter() - start)
    return float(np.median(group.all_reduce(np.array(times[1:]), op="max")))


def measure_collectives(group, sizes, large=16 * 2**20):
    """{n: {"alpha_us", "bandwidth_gbps"}} for each group size n in `sizes`: the world split
    into groups of n consecutive ranks, all reducing at once, an 8-byte and a `large` all-reduce
    (the slowest group's median) fitted to the ring's 2(n − 1)(α + bytes/n · β) (alpha_beta.ring_all_reduce)."""
    figures = {}
    for n in sizes:
        sub = group.split(group.rank // n)
        seconds = np.array([all_reduce_seconds(sub, 8, repeats=50), all_reduce_seconds(sub, large, repeats=3)])
        small_s, large_s = group.all_reduce(seconds, op="max")   # the slowest group's
        alpha = small_s / (2 * (n - 1))
        beta = max(large_s - small_s, 1e-12) / (2 * (n - 1) * large / n)
        figures[n] = {"alpha_us": alpha * 1e6, "bandwidth_gbps": 1 / beta / 1e9}
    return figures


def measure_alone_speedup(group, config):
    """On rank 0 (None elsewhere): a block's forward + backward time with every rank computing
    over its time while the others wait in MPI — what a pipeline bubble frees (shared_cores)."""
    together = sum(measure_parts(config, 2, 1).block)
    group.barrier()
    alone = sum(measure_parts(config, 2, 1).block) if group.rank == 0 else None
    group.barrier()
    return together / alone if group.rank == 0 else None


def worker(config_name, batch, microbatch_counts, steps, repeats):
    """Sweep the layouts `repeats` times (interleaved, so a slow spell of the machine hits
    every layout alike), each sweep measuring the link and the parts first; rank 0 prints one
    JSON line per link, part and layout and sweep. Freed memory stays in each rank, as in
    `python -m parallel.train` (minitensor.allocator): the steps measured are the job's."""
    keep_freed_memory()
    group, config = world(), get_config(config_name)
    runs = [(layout, m) for m in microbatch_counts for layout in runnable(config, batch, m, group.size)]
    group_sizes = sorted({size for layout, _ in runs for size in unpack(layout)[:2] if size > 1})
    for _ in range(repeats):
        link, speedup = measure_link(group), measure_alone_speedup(group, config)
        collectives = measure_collectives(group, group_sizes)
        if group.rank == 0:
            print(json.dumps({"link": {**link, "alone_speedup": speedup, "collectives": collectives}}), flush=True)
        for b, tp in sorted({(batch // (unpack(layout)[0] * m), unpack(layout)[1]) for layout, m in runs}):
            parts = measure_parts_on_every_rank(group, config, b, tp)
            if group.rank == 0:
                print(json.dumps({"parts": [b, tp], "costs": dataclasses.asdict(parts)}), flush=True)
        for layout, m in runs:
            times, memory = run_layout(group, config, layout, batch, m, steps)
            if group.rank == 0:
                print(json.dumps({"layout": layout, "microbatches": m, "seconds": float(np.median(times)),
                                  "steps": times, "memory": memory}), flush=True)
