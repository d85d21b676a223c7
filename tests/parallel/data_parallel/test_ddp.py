"""DataParallel on the threads backend: equal to one device on the global batch, always."""
import contextlib

import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st
from mpi_scripts.dp_common import check_data_parallel, make_data, run_data_parallel, run_single, tiny_net
from strategies import seeds

import minitensor as mt
import parallel
from minitensor import nn
from minitensor.nn import functional as F
from parallel import DataParallel, run_threads

STEPS = 3


def train_and_check(model_name, seed, n, micro, bucket_mb, overlap, explicit_finish, rows=2):
    data = make_data(seed, n, micro, rows, STEPS)
    ref = run_single(model_name, seed, data)
    runs = run_threads(n, lambda: run_data_parallel(parallel.world(), model_name, seed, data, micro, bucket_mb,
                                                    overlap, explicit_finish), timeout=60)
    for run in runs:
        check_data_parallel(run, ref, n, STEPS)


# 1e-6 MiB is a byte: every parameter gets a bucket of its own; 0.001 MiB holds a few; 25 holds all.
@given(n=st.integers(1, 4), micro=st.integers(1, 3), bucket_mb=st.sampled_from([1e-6, 0.001, 25]),
       overlap=st.booleans(), explicit_finish=st.booleans(), seed=seeds)
def test_equals_one_device_on_the_global_batch(n, micro, bucket_mb, overlap, explicit_finish, seed):
    train_and_check("tiny", seed, n, micro, bucket_mb, overlap, explicit_finish)


@pytest.mark.parametrize("n, micro, bucket_mb, overlap", [(2, 2, 0.002, True), (3, 1, 1e-6, False)])
def test_gpt_equals_one_device(n, micro, bucket_mb, overlap):
    train_and_check("gpt", 7, n, micro, bucket_mb, overlap, explicit_finish=False)


def test_the_hook_of_a_parameter_used_twice_fires_once_with_the_summed_gradient():
    w = mt.tensor(np.array([2.0, 3.0]), requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.copy()))
    ((w * w).sum() + (w * 5.0).sum()).backward()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], 2 * w.data + 5.0)
    np.testing.assert_array_equal(w.grad, seen[0])


class TwoHeads(nn.Module):
    """`a` is used on every rank; `b` only when the batch says so; `never` is never used."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.b = nn.Linear(3, 2)
        self.never = nn.Linear(3, 2)

    def forward(self, x, use_b):
        y = self.a(x)
        return (y + self.b(x) if use_b else y).sum()


def test_unused_parameters_count_as_zero_and_backward_still_finishes_the_sync():
    x = mt.tensor(np.arange(6.0).reshape(2, 3))

    def rank_fn():
        group = parallel.world()
        mt.manual_seed(group.rank)
        dp = DataParallel(TwoHeads().double(), group, bucket_mb=1e-6)
        dp(x, use_b=group.rank == 0).backward()  # no finish_grad_sync() call: backward's end syncs
        return {name: p.grad for name, p in dp.named_parameters()}, group.stats()["all_reduce"]["elements"]

    results = run_threads(3, rank_fn, timeout=30)
    for grads, elements in results:
        np.testing.assert_array_equal(grads["a.weight"], np.tile(x.data.sum(axis=0), (2, 1)))
        np.testing.assert_array_equal(grads["b.weight"], np.tile(x.data.sum(axis=0), (2, 1)) / 3)
        np.testing.assert_array_equal(grads["never.weight"], np.zeros((2, 3)))
        assert elements == 3 * (6 + 2)


def test_an_unfinished_sync_is_caught_at_the_next_forward():
    def rank_fn():
        group = parallel.world()
        mt.manual_seed(0)
        model = nn.Linear(3, 2).double()
        dp = DataParallel(model, group)
        x = mt.tensor(np.ones((1, 3)))
        out = dp(x)
        # Backward from a tensor that is not forward's output: the bias hook fires, the weight's never does.
        (model.bias * 1.0).sum().backward()
        with pytest.raises(RuntimeError, match="1 of 2 trainable parameters ready"):
            dp(x)
        dp.finish_grad_sync()
        out.sum().backward()  # the next step runs normally
        return model.weight.grad

    for grad in run_threads(2, rank_fn, timeout=30):
        np.testing.assert_array_equal(grad, np.ones((2, 3)))


def test_a_gradient_for_a_parameter_forward_did_not_use_is_an_error():
    def rank_fn():
        dp = DataParallel(TwoHeads().double(), parallel.world())
        loss = dp(mt.tensor(np.ones((1, 3))), use_b=False) + (dp.module.b.weight * 1.0).sum()
        loss.backward()

    with pytest.raises(RuntimeError, match="parameter 'b.weight' got a gradient although the output of forward"):
        run_threads(2, rank_fn, timeout=30)


def test_rejects_a_non_positive_bucket_size():
    with pytest.raises(ValueError, match="bucket_mb=0 must be positive"):
        DataParallel(tiny_net(), parallel.world(), bucket_mb=0)


def test_delegates_to_the_module_under_single_device_names():
    mt.manual_seed(0)
    model = tiny_net()
    dp = DataParallel(model, parallel.world())
    assert [name for name, _ in dp.named_parameters()] == [name for name, _ in model.named_parameters()]
    idx = np.zeros((1, 5), np.int64)
    logits, loss = dp(idx, idx)
    assert_close(loss.data, F.cross_entropy(model(idx, idx)[0], idx).data)


def test_a_forward_inside_no_sync_never_syncs_even_if_its_backward_runs_outside():
    # As in DDP, forward decides: `b` unused by step 1's forward must not haunt step 2's.
    x = mt.tensor(np.arange(6.0).reshape(2, 3))

    def rank_fn():
        group = parallel.world()
        mt.manual_seed(group.rank)
        dp = DataParallel(TwoHeads().double(), group, bucket_mb=1e-6)
        dp(x, use_b=False).backward()  # step 1 syncs; `b` counts as unused
        dp.zero_grad()
        group.reset_stats()
        with dp.no_sync():
            out = dp(x * (group.rank + 1.0), use_b=True)
        out.backward()  # outside the block, yet local: its forward ran inside
        local = dp.module.b.weight.grad.copy()
        calls_after_backward = group.stats().get("all_reduce", {}).get("calls", 0)
        dp.finish_grad_sync()
        return local, calls_after_backward, dp.module.b.weight.grad

    column_sums = x.data.sum(axis=0)
    for rank, (local, calls, synced) in enumerate(run_threads(2, rank_fn, timeout=30)):
        np.testing.assert_array_equal(local, np.tile(column_sums * (rank + 1), (2, 1)))
        assert calls == 0
        np.testing.assert_array_equal(synced, np.tile(column_sums * 1.5, (2, 1)))


class SometimesDetached(nn.Module):
    """A loss that reaches the Linear, or (detached=True) only the input: no parameter gets a gradient."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x, detached):
        return (x * 2.0).sum() if detached else self.lin(x).sum()


@pytest.mark.parametrize("inside_no_sync", [True, False])
def test_a_rank_whose_loss_reaches_no_parameter_still_takes_part_in_the_sync(inside_no_sync):
    # Rank 1 gets no gradient at all; rank 0 all-reduces and waits for it (a hang under MPI,
    # a DeadlockError on threads if rank 1 skipped the sync).
    def rank_fn():
        group = parallel.world()
        mt.manual_seed(group.rank)
        dp = DataParallel(SometimesDetached().double(), group)
        x = mt.tensor(np.ones((1, 3)), requires_grad=True)
        with dp.no_sync() if inside_no_sync else contextlib.nullcontext():
            dp(x, detached=group.rank == 1).backward()
        dp.finish_grad_sync()
        return dp.module.lin.weight.grad, dp.module.lin.bias.grad

    for weight_grad, bias_grad in run_threads(2, rank_fn, timeout=30):
        np.testing.assert_array_equal(weight_grad, np.full((2, 3), 0.5))
        np.testing.assert_array_equal(bias_grad, np.full(2, 0.5))


def test_on_a_sub_group_gradients_are_averaged_over_the_sub_group_only():
    # A world of 4 split into two dp groups of 2: ranks {0, 2} and {1, 3}. Rank r feeds
    # (r + 1)·x, so its group's average input is 2·x for {0, 2} and 3·x for {1, 3}.
    x = np.arange(6.0).reshape(2, 3)

    def rank_fn():
        world = parallel.world()
        group = world.split(color=world.rank % 2, key=world.rank)
        mt.manual_seed(0)
        dp = DataParallel(nn.Linear(3, 2).double(), group)
        dp(mt.tensor(x * (world.rank + 1))).sum().backward()
        return group.size, dp.module.weight.grad, group.stats()["all_reduce"]["calls"], world.stats()

    for rank, (size, grad, calls, world_stats) in enumerate(run_threads(4, rank_fn, timeout=30)):
        assert size == 2 and calls == 1
        np.testing.assert_array_equal(grad, np.tile(x.sum(axis=0) * (2 + rank % 2), (2, 1)))
        assert "all_reduce" not in world_stats  # nothing crossed to the other group


class Chain(nn.Module):
    """Three Linears registered (and run) in order; the first has no bias, so its weight
    is the one parameter whose gradient is final last."""

    def __init__(self):
        super().__init__()
        self.first, self.middle, self.last = nn.Linear(3, 4, bias=False), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.last(self.middle(self.first(x))).sum()


class AllReduceWatch:
    """The group, noting for each all_reduce the size of the buffer and whether backward had
    already produced the gradient that is final last (the first layer's weight). The real
    all-reduce still runs."""

    def __init__(self, group, last_gradient_of):
        self.group, self.last_gradient_of, self.calls = group, last_gradient_of, []

    def __getattr__(self, name):
        return getattr(self.group, name)

    def all_reduce(self, arr, *args, **kwargs):
        self.calls.append((arr.size, self.last_gradient_of.grad is not None))
        return self.group.all_reduce(arr, *args, **kwargs)


@pytest.mark.parametrize("overlap", [True, False])
def test_buckets_hold_parameters_in_reverse_order_and_start_during_backward(overlap):
    def rank_fn():
        mt.manual_seed(0)
        model = Chain().double()
        group = AllReduceWatch(parallel.world(), model.first.weight)
        dp = DataParallel(model, group, bucket_mb=1e-6, overlap=overlap)  # a bucket per parameter
        order = [[name for p in bucket.params for name, q in model.named_parameters() if q is p]
                 for bucket in dp.buckets]
        dp(mt.tensor(np.ones((2, 3)))).backward()
        return order, group.calls

    for order, calls in run_threads(2, rank_fn, timeout=30):
        assert order == [["last.bias"], ["last.weight"], ["middle.bias"], ["middle.weight"], ["first.weight"]]
        assert [size for size, _ in calls] == [2, 8, 4, 16, 12]  # bucket 0 first
        # Overlapped, every bucket but the last starts before backward reaches the first layer;
        # without overlap, all of them wait for the end of backward.
        assert [done for _, done in calls] == ([False] * 4 + [True] if overlap else [True] * 5)


# --- a 16-bit model (minitensor.amp): gradients reduced in float32 -----------------------------

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(np.ones(1, np.float32))

    def forward(self, x):
        return (self.w * mt.tensor(x)).sum()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the float16 sum, on purpose
@pytest.mark.parametrize("reduce_dtype", [np.float32, None], ids=["float32", "float16"])
def test_a_float16_models_gradients_are_summed_in_float32_and_their_mean_rounded_once(reduce_dtype):
    # Each rank's float16 gradient is 40000 (finite: float16 ends at 65504); their sum, 80000, is not.
    # Summed in float32 the mean is 40000 on every rank; summed in float16 the sum overflows to inf.
    from minitensor.amp import MixedPrecision, precision_policy

    def rank_fn():
        model = Scaled()
        amp = MixedPrecision(model.parameters(), precision_policy("fp16"), init_scale=1.0)
        ddp = DataParallel(model, parallel.world(), reduce_dtype=reduce_dtype)
        amp.backward(ddp(np.full(1, 40000.0 + parallel.world().rank * 8, np.float16)))
        amp.grads_to_master()
        return model.w.grad.dtype, amp.masters[0].grad, ddp.buckets[0].dtype

    for grad_dtype, master_grad, buffer_dtype in run_threads(2, rank_fn, timeout=30):
        assert grad_dtype == np.float16
        if reduce_dtype is None:
            assert buffer_dtype == np.float16 and np.isinf(master_grad).all()
        else:
            assert buffer_dtype == np.float32
            np.testing.assert_array_equal(master_grad, np.float32(np.float16(40004.0)))  # the mean, rounded once


def test_a_16_bit_model_under_data_parallelism_equals_one_device_under_the_same_policy():
    # the GPT in float16 with float32 masters on 2 ranks (rank-specific rows) against one device on the
    # global batch under the same policy: a few 16-bit roundings moved (each rank rounds its own
    # half-batch gradient), within 10 eps of float16; a missing mean (twice the gradient) is far outside
    from minitensor.amp import MixedPrecision, precision_policy
    from minitensor.models.gpt import GPT, GPTConfig
    from minitensor.optim import AdamW
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, d_model=16)
    rng = np.random.default_rng(5)
    data = [(rng.integers(0, 11, (4, 8)), rng.integers(0, 11, (4, 8))) for _ in range(3)]

    def train(group=None):
        mt.manual_seed(0)
        model = GPT(config)
        amp = MixedPrecision(model.parameters(), precision_policy("fp16"), init_scale=2.0**8)
        forward = model if group is None else DataParallel(model, group, reduce_dtype=np.float32)
        optimizer = AdamW(amp.masters, lr=1e-4)
        rows = slice(None) if group is None else slice(2 * group.rank, 2 * group.rank + 2)
        grads = []
        for idx, targets in data:
            amp.backward(forward(idx[rows], targets[rows])[1])
            amp.grads_to_master()
            grads.append([m.grad / amp.scaler.scale for m in amp.masters])
            assert amp.step(optimizer)
            amp.zero_grad()
        return grads

    ref = train()
    for grads in run_threads(2, lambda: train(parallel.world()), timeout=60):
        for step, (got, want) in enumerate(zip(grads, ref)):
            scale = max(float(np.abs(g).max()) for g in want)
            worst = max(float(np.abs(a - b).max()) for a, b in zip(got, want)) / scale
            doubled = max(float(np.abs(2 * a - b).max()) for a, b in zip(got, want)) / scale
            assert worst <= 10 * 2.0**-10 < 100 * 2.0**-10 < doubled, (step, worst, doubled)
