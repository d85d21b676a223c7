"""Data parallel and ZeRO-1 against one device: the runs and checks shared by the
threads tests (tests/parallel/data_parallel/test_ddp.py, test_zero.py) and the mpiexec
worker (dp_equivalence.py), so both backends are held to exactly the same checks.
Needs tests/ on sys.path (for helpers), as under pytest.

A run trains `steps` AdamW steps on a global batch of `n * micro * rows` sequences:
rank r takes rows [r·L, (r+1)·L) (L = micro·rows), cut into `micro` micro-batches whose
losses are scaled by 1/micro. The reference trains one device on the whole batch.
"""
import numpy as np

import minitensor as mt
from minitensor import nn
from minitensor.models import GPT, GPTConfig
from minitensor.nn import functional as F
from minitensor.optim import AdamW
from parallel import DataParallel, ZeroOptimizer
from helpers import assert_close

LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.1
VOCAB, SEQ = 11, 5


class TinyNet(nn.Module):
    """A small language model with the three cases data parallelism must get right:
    a frozen Linear, a Linear applied twice, and an lm head tied to the embedding."""

    def __init__(self, vocab=VOCAB, d=8, hidden=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.frozen = nn.Linear(d, d)
        for p in self.frozen.parameters():
            p.requires_grad = False
        self.twice = nn.Linear(d, d)
        self.fc = nn.Linear(d, hidden)
        self.proj = nn.Linear(hidden, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.frozen(self.emb(idx)).tanh()
        x = self.twice(self.twice(x).tanh())
        x = x + self.proj(F.gelu(self.fc(x), approximate="tanh"))
        logits = self.ln(x) @ self.emb.weight.T  # the tied head: emb.weight is used twice too
        return logits, F.cross_entropy(logits, targets)


def tiny_net():
    return TinyNet().double()


def tiny_gpt():
    """GPT with its position embedding frozen, so a frozen parameter sits in a real model."""
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=2, d_model=8)).double()
    model.pos_emb.weight.requires_grad = False
    return model


MODELS = {"tiny": tiny_net, "gpt": tiny_gpt}


def make_data(seed, n, micro, rows, steps):
    """(idx, targets) of the global batch for each step."""
    rng = np.random.default_rng(seed)
    shape = (n * micro * rows, SEQ)
    return [(rng.integers(0, VOCAB, shape), rng.integers(0, VOCAB, shape)) for _ in range(steps)]


def micro_batches(batch, rank, n, micro):
    idx, targets = batch
    local = len(idx) // n
    rows = local // micro
    start = rank * local
    return [(idx[s:s + rows], targets[s:s + rows]) for s in range(start, start + local, rows)]


def grads_of(model):
    return {name: p.grad.copy() for name, p in model.named_parameters() if p.requires_grad}


def trainable_numel(model):
    return sum(p.size for p in model.parameters() if p.requires_grad)


def run_single(model_name, seed, data, moment_dtype=None):
    """The reference: one device, whole batch (AdamW's moments in `moment_dtype`). Returns initial params,
    per-step losses and grads, final params."""
    mt.manual_seed(seed)
    model = MODELS[model_name]()
    initial = model.state_dict()
    opt = AdamW(model.parameters(), LR, BETAS, EPS, WEIGHT_DECAY, moment_dtype)
    losses, grads = [], []
    for idx, targets in data:
        opt.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        losses.append(loss.item())
        grads.append(grads_of(model))
        opt.step()
    return dict(initial=initial, losses=losses, grads=grads, final=model.state_dict(),
                state_bytes=opt.state_bytes(), numel=trainable_numel(model))


def local_step(forward, batches, micro):
    """Forward and backward over some of this rank's `micro` micro-batches; returns their share of the local loss."""
    total = 0.0
    for mb_idx, mb_targets in batches:
        _, loss = forward(mb_idx, mb_targets)
        (loss * (1.0 / micro)).backward()
        total += loss.item() / micro
    return total


def run_data_parallel(group, model_name, seed, data, micro, bucket_mb, overlap, explicit_finish):
    """DataParallel on this rank, seeded differently from every other rank.

    explicit_finish=False: the first micro-1 micro-steps under no_sync, the last one
    syncs by itself at the end of its backward (no call in between). True: every
    micro-step under no_sync, then finish_grad_sync() (a pipeline's pattern).
    """
    rank, n = group.rank, group.size
    mt.manual_seed(seed + 1000 * rank)
    model = MODELS[model_name]()
    dp = DataParallel(model, group, bucket_mb=bucket_mb, overlap=overlap)
    initial = model.state_dict()
    opt = AdamW(model.parameters(), LR, BETAS, EPS, WEIGHT_DECAY)
    group.reset_stats()
    losses, grads = [], []
    for batch in data:
        opt.zero_grad()
        mbs = micro_batches(batch, rank, n, micro)
        with dp.no_sync():
            loss = local_step(dp, mbs[:-1], micro)
        if explicit_finish:
            with dp.no_sync():
                loss += local_step(dp, mbs[-1:], micro)
            dp.finish_grad_sync()
        else:
            loss += local_step(dp, mbs[-1:], micro)
        losses.append(loss)
        grads.append(grads_of(model))
        opt.step()
    stats = group.stats()
    return dict(initial=initial, losses=global_mean(group, losses), grads=grads, final=model.state_dict(),
                stats=stats, replicas=gather_params(group, model))


def run_zero(group, model_name, seed, data, micro, moment_dtype=None):
    """ZeroOptimizer on the plain model (no DataParallel: the optimizer reduces the gradients)."""
    rank, n = group.rank, group.size
    mt.manual_seed(seed + 1000 * rank)
    model = MODELS[model_name]()
    opt = ZeroOptimizer(model.parameters(), group, LR, BETAS, EPS, WEIGHT_DECAY, moment_dtype=moment_dtype)
    initial = model.state_dict()
    group.reset_stats()
    losses, grad_shards = [], []
    for batch in data:
        opt.zero_grad()
        losses.append(local_step(model, micro_batches(batch, rank, n, micro), micro))
        before = opt.exp_avg.copy()
        opt.step()
        grad_shards.append(averaged_gradient_used(opt, before))
    stats = group.stats()
    return dict(initial=initial, losses=global_mean(group, losses), grad_shards=grad_shards, shard=opt.shard,
                final=model.state_dict(), stats=stats, state_bytes=opt.state_bytes(),
                replicas=gather_params(group, model))


def averaged_gradient_used(opt, exp_avg_before):
    """The averaged gradient chunk this rank's step fed to AdamW, read back from its first moment
    (m ← β₁·m + (1 − β₁)·g; weight decay is decoupled): ZeroOptimizer keeps no copy of it after
    the step, so that nothing but the moments outlives the step."""
    beta1 = opt.defaults["betas"][0]
    return (opt.exp_avg - beta1 * exp_avg_before) / (1 - beta1)


def global_mean(group, local_values):
    """The global batch's loss per step: the mean over ranks of the local means."""
    return group.all_reduce(np.array(local_values)) / group.size


def gather_params(group, model):
    """Every rank's parameters, flattened, one row per rank."""
    flat = np.concatenate([p.data.reshape(-1) for p in model.parameters()])
    return group.all_gather(flat[None])


def check_common(run, ref, n):
    """Same start (rank 0's weights), same losses, same final parameters, replicas bit-identical."""
    for name, value in ref["initial"].items():
        np.testing.assert_array_equal(run["initial"][name], value, err_msg=f"initial {name}")
    assert_close(run["losses"], np.array(ref["losses"]))
    for name, value in ref["final"].items():
        assert_close(run["final"][name], value)
    replicas = run["replicas"]
    assert all(np.array_equal(replicas[0], replicas[r]) for r in range(n)), "replicas differ across ranks"
    for name, value in ref["initial"].items():
        if name.startswith(("frozen.", "pos_emb.")):
            np.testing.assert_array_equal(run["final"][name], value, err_msg=f"frozen {name} changed")


def check_data_parallel(run, ref, n, steps):
    """Plus: every gradient, and exactly the trainable elements all-reduced once per step."""
    check_common(run, ref, n)
    for got, want in zip(run["grads"], ref["grads"]):
        assert got.keys() == want.keys()
        for name in want:
            assert_close(got[name], want[name])
    assert run["stats"]["all_reduce"]["elements"] == steps * ref["numel"], run["stats"]
    assert set(run["stats"]) == {"all_reduce"}, run["stats"]


def check_zero(run, ref, n, steps):
    """Plus: this rank's averaged gradient chunk, reduce-scatter + all-gather of the
    (padded) trainable elements per step and nothing else, 1/n of AdamW's state."""
    check_common(run, ref, n)
    start, stop = run["shard"]
    for got, want in zip(run["grad_shards"], ref["grads"]):
        assert_close(got[:stop - start], np.concatenate([g.reshape(-1) for g in want.values()])[start:stop])
    padded = -(-ref["numel"] // n) * n
    stats = run["stats"]
    assert set(stats) == {"reduce_scatter", "all_gather"}, stats
    assert stats["reduce_scatter"]["elements"] == stats["all_gather"]["elements"] == steps * padded, stats
    itemsize = 8  # float64 moments, two of them per element
    assert run["state_bytes"] == 2 * itemsize * padded // n
    assert abs(run["state_bytes"] - ref["state_bytes"] / n) <= 2 * itemsize


# --- ZeRO-2 / ZeRO-3 (parallel.data_parallel.fully_sharded) ---------------------------------------

# ZeRO-3 units: TinyNet's `twice` is called twice per forward; its embedding is tied to the
# head, so it stays in the root unit (gathered for the whole forward); `frozen` is in none.
UNITS = {"tiny": ["twice", "fc", "proj", "ln"], "gpt": ["tok_emb", "blocks.0", "blocks.1", "ln_f", "lm_head"]}


def run_fully_sharded(group, model_name, seed, data, micro, stage, prefetch=1, moment_dtype=None):
    """FullyShardedDataParallel (stage 2 or 3) on this rank, seeded differently from every
    other rank; the first micro-1 micro-steps under no_sync. Records the gathered gradients,
    the counted communication and the bytes the rank holds after the last step."""
    from parallel import FullyShardedDataParallel
    from parallel.data_parallel.flat_units import held_bytes

    rank, n = group.rank, group.size
    mt.manual_seed(seed + 1000 * rank)
    model = MODELS[model_name]()
    fsdp = FullyShardedDataParallel(model, group, stage=stage, units=UNITS[model_name] if stage == 3 else (),
                                    prefetch=prefetch)
    opt = fsdp.configure_optimizer(LR, BETAS, EPS, WEIGHT_DECAY, moment_dtype)
    initial = fsdp.full_state_dict()
    groups = [group] + (fsdp.sharding.groups if fsdp.sharding else [])

    def counted():
        stats = [g.stats() for g in groups]
        for g in groups:
            g.reset_stats()
        return stats
    counted()
    losses, grads, stats = [], [], []
    for batch in data:
        opt.zero_grad()
        mbs = micro_batches(batch, rank, n, micro)
        with fsdp.no_sync():
            loss = local_step(fsdp, mbs[:-1], micro)
        loss += local_step(fsdp, mbs[-1:], micro)
        losses.append(loss)
        backward = counted()
        grads.append(fsdp.full_grads())
        counted()
        opt.step()
        stats.append((backward, counted()))
    buckets = fsdp.reducer.buckets
    shards = [b.param_shard for b in buckets] if stage == 3 else []
    memory = {"params": held_bytes([p.data for p in model.parameters()] + shards),
              "grads": held_bytes([p.grad for p in model.parameters() if p.grad is not None]
                                  + [b.grad_shard for b in buckets]),
              "optim": opt.state_bytes()}
    uses = [unit.name for unit in fsdp.sharding.forward_order] if fsdp.sharding else []
    gathered = sum(uses.count(unit.name) * unit.bucket.shard_size * n for unit in fsdp.sharding.units) if uses else 0
    return dict(initial=initial, losses=global_mean(group, losses), grads=grads, final=fsdp.full_state_dict(),
                stats=stats, memory=memory, micro=micro, padded=sum(b.shard_size for b in buckets) * n, gathered=gathered,
                frozen=sum(p.data.nbytes for p in model.parameters() if not p.requires_grad))


def check_fully_sharded(run, ref, n, stage, steps):
    """Same losses, every gradient and the parameters after each AdamW step as one device;
    per step exactly the formula's communication; the bytes held equal the formula."""
    for name, value in ref["initial"].items():
        np.testing.assert_array_equal(run["initial"][name], value, err_msg=f"initial {name}")
    assert_close(run["losses"], np.array(ref["losses"]))
    for got, want in zip(run["grads"], ref["grads"]):
        assert got.keys() == want.keys()
        for name in want:
            assert_close(got[name], want[name], f"gradient of {name}")
    for name, value in ref["final"].items():
        assert_close(run["final"][name], value, f"{name} after {steps} steps")
    itemsize, padded = 8, run["padded"]  # float64; each bucket padded to n equal chunks
    # Rajbhandari et al. with K = 2 (AdamW's two moments) in bytes of float64, Ψ/n meaning
    # Σ over buckets of ceil(Ψ_bucket / n): stage 2 keeps Ψ params, Ψ/n grads, KΨ/n states;
    # stage 3 Ψ/n params too (plus the frozen parameters, which every rank keeps whole).
    shard_bytes = padded // n * itemsize
    expected = {"params": (shard_bytes if stage == 3 else ref["numel"] * itemsize) + run["frozen"],
                "grads": shard_bytes, "optim": 2 * shard_bytes}
    assert run["memory"] == expected, (run["memory"], expected)
    for (backward, after_step) in run["stats"]:
        # one reduce-scatter of every bucket per step (the synced backward), (n-1)/n of it per rank
        reduced = backward[0]["reduce_scatter"]
        assert (reduced["elements"], reduced["bytes"]) == (padded, (n - 1) * padded * itemsize // n), reduced
        if stage == 2:  # the step's all-gather of the updated chunks: stages 1 and 2 move what DP moves
            assert after_step[0]["all_gather"]["elements"] == padded
        else:  # every use of a unit gathered twice per micro-batch, forward and backward: 1.5x DP at one use
            assert set(after_step[0]) == set() and set(backward[0]) == {"reduce_scatter"}
            assert backward[1]["all_gather"]["elements"] == 2 * run["micro"] * run["gathered"]
