"""Compressed data parallelism against its exact references: the runs and checks shared by
the threads tests (tests/parallel/data_parallel/test_comm_hooks.py) and the mpiexec worker
(compress_equivalence.py). Needs tests/ on sys.path (for helpers), as under pytest.

A run trains `steps` AdamW steps of dp_common's TinyNet through DataParallel with a
communication hook, on rank-specific rows of the global batch (dp_common.make_data).
"""
import math

import minitensor as mt
from minitensor.optim import AdamW
from parallel import DataParallel
from parallel.comm.threads import single_rank_group
from parallel.data_parallel.comm_hooks import PowerSGD, SignCompression, TopK
from parallel.data_parallel.reducer import Reducer
from mpi_scripts.dp_common import BETAS, EPS, LR, MODELS, WEIGHT_DECAY, grads_of, micro_batches, run_single
from helpers import assert_close

HOOKS = {"powersgd": PowerSGD, "topk": TopK, "sign": SignCompression}


def make_hook(name, **options):
    return HOOKS[name](**options)


def run_compressed(group, hook, seed, data, bucket_mb):
    """DataParallel with `hook` on this rank (seeded differently per rank: rank 0's weights win)."""
    mt.manual_seed(seed + 1000 * group.rank)
    model = MODELS["tiny"]()
    dp = DataParallel(model, group, bucket_mb=bucket_mb)
    dp.register_comm_hook(hook)
    opt = AdamW(model.parameters(), LR, BETAS, EPS, WEIGHT_DECAY)
    grads, stats = [], []
    for batch in data:
        opt.zero_grad()
        group.reset_stats()
        (idx, targets), = micro_batches(batch, group.rank, group.size, 1)
        dp(idx, targets)[1].backward()
        stats.append(group.stats())
        grads.append(grads_of(model))
        opt.step()
    return dict(grads=grads, final=model.state_dict(), stats=stats, buckets=dp.buckets)


def run_mean_gradient_reference(hook, seed, data, bucket_mb):
    """One process: the global batch's gradient (the mean of the ranks') through the same hook on a
    group of one rank, bucketed exactly as DataParallel buckets (reverse registration order)."""
    mt.manual_seed(seed)
    model = MODELS["tiny"]()
    trainable = [p for p in model.parameters() if p.requires_grad]
    reducer = Reducer(trainable[::-1], single_rank_group(), bucket_mb)
    reducer.register_comm_hook(hook)
    opt = AdamW(model.parameters(), LR, BETAS, EPS, WEIGHT_DECAY)
    grads = []
    for idx, targets in data:
        opt.zero_grad()
        model(idx, targets)[1].backward()
        reducer.finish()
        grads.append(grads_of(model))
        opt.step()
    return dict(grads=grads, final=model.state_dict())


def check_same_training(run, ref):
    """Every step's gradients and the final parameters, to 1e-9 relative."""
    for got, want in zip(run["grads"], ref["grads"]):
        assert got.keys() == want.keys()
        for name in want:
            assert_close(got[name], want[name], err_msg=name)
    for name, value in ref["final"].items():
        assert_close(run["final"][name], value, err_msg=name)


def reference(name, options, seed, data, bucket_mb):
    """The exact reference of each method: plain DP in its limit case (PowerSGD at full rank,
    top-k at ratio 1), else PowerSGD on the mean gradient in one process."""
    if name == "powersgd" and options.get("rank", 0) < 100:
        return run_mean_gradient_reference(make_hook(name, **options), seed, data, bucket_mb)
    return run_single("tiny", seed, data)


# --- bytes per step: the formula of each method -------------------------------------------

def ring(n, nbytes):
    """The accounting's all-reduce bytes of one call."""
    return 2 * (n - 1) * nbytes // n


def expected_bytes(hook, buckets, n, itemsize=8):
    """{kind: bytes} one rank sends in one compressed step."""
    if isinstance(hook, PowerSGD):
        total = 0
        for bucket in buckets:
            matrices, plain = hook.plan(bucket)
            if not matrices:
                total += ring(n, bucket.numel * itemsize)
                continue
            plain_elements = sum(w.stop - w.start for w in plain)
            total += ring(n, plain_elements * itemsize) if plain else 0
            total += ring(n, sum(m * r for _, (m, _, r) in matrices) * itemsize)  # P: (m + k)·r per matrix,
            total += ring(n, sum(k * r for _, (_, k, r) in matrices) * itemsize)  # in two all-reduces
        return {"all_reduce": total}
    if isinstance(hook, TopK):
        return {"all_gather": sum((n - 1) * hook.k(b.numel) * (itemsize + 8) for b in buckets)}
    if isinstance(hook, SignCompression):
        return {"all_gather": sum((n - 1) * (8 * math.ceil(b.numel / 64) + itemsize * len(b.params))
                                  for b in buckets)}
    raise TypeError(hook)


def check_bytes(run, hook, n):
    for step_stats in run["stats"]:
        counted = {kind: counts["bytes"] for kind, counts in step_stats.items()}
        assert counted == expected_bytes(hook, run["buckets"], n), counted

