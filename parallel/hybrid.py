"""3D parallelism: data × tensor × pipeline over a `Mesh(dp, tp, pp)` (Megatron-LM's PTD-P).

    global batch (B, T) ──split over dp──▶ this dp rank's rows (B/dp, T)
        ──pipeline over pp──▶ m micro-batches through this rank's stage(s), any schedule;
                              each stage's parts are tensor parallel over tp
                              (heads, MLP columns, vocabulary; SP: the sequence between them)
        ──gradients──▶ TP: sum the sequence-parallel partial grads over tp
                       DP: average over dp (DataParallel's buckets; under ZeRO-1 the
                           optimizer's reduce-scatter does it, under ZeRO-2/3 the
                           reducer reduce-scatters and keeps this rank's chunk)
        ──optimizer──▶ AdamW on this rank's shards, or ZeroOptimizer over dp

ZeRO-3 (`zero=3`) also shards each pipeline stage's parameters over dp, per unit (the
token and position embeddings, each block, ln_f, the lm_head; fully_sharded.py): a
unit is all-gathered for each micro-batch's forward and backward and freed after. Its
gradients are reduce-scattered once per step, after the schedule, where the dp mean
of every other layout happens too.

Every rank runs this same code on its own cell of the grid. Nothing here is new
mechanism, only composition: `stages_for_rank` cuts the dense GPT into this rank's
pipeline stages, `TensorParallelStage` converts each over the tp group, `Pipeline` runs
them over the pp group, and the gradient `Reducer` (or `ZeroOptimizer`) spans the dp group.

Gradient accumulation: `train_step` ADDS the gradient of one global batch to `.grad`;
`optimizer_step()` first finishes the sync (dividing by the number of accumulated
batches, so the step sees the gradient of their mean loss), then steps and zeroes.
"""
import contextlib

import numpy as np

from minitensor.optim import AdamW

from .comm.gather import gather_named_arrays
from .data_parallel import broadcast_parameters
from .fully_sharded import Sharding, fully_shard, gather_grad_shards, held_bytes
from .model import ParallelModel
from .pipeline.executor import Pipeline
from .pipeline.partition import stages_for_rank
from .reducer import Reducer, ShardedReducer
from .tensor_parallel import TensorParallelStage
from .zero import ZeroOptimizer


class HybridGPT(ParallelModel):
    """This rank's part of `gpt` under the 3D layout `mesh` (every rank passes the same dense GPT).

    microbatches: m per global batch and dp rank; schedule: "gpipe", "1f1b",
    "interleaved" (with `chunks` = v model chunks per pp rank) or the zero-bubble
    "zb-h1" / "zb-h2" (pipeline.zero_bubble); balance: blocks per
    pipeline stage (default: by parameter count); sequence_parallel, checkpoint_activations:
    switches; zero: the ZeRO stage over dp (0 or False: plain, 1 or True: sharded AdamW
    moments, 2: + gradients, 3: + parameters); prefetch: ZeRO-3 all-gathers issued ahead;
    seed: the TP dropout streams.
    """

    def __init__(self, gpt, mesh, microbatches=1, schedule="1f1b", chunks=1, balance=None,
                 sequence_parallel=False, checkpoint_activations=False, zero=0, seed=0, prefetch=1):
        config = gpt.config
        if config.n_head % mesh.tp:
            raise ValueError(f"n_head={config.n_head} is not divisible by tp={mesh.tp}")
        if int(zero) not in (0, 1, 2, 3):
            raise ValueError(f"zero={zero!r} is not a ZeRO stage 0, 1, 2 or 3")
        self.config, self.mesh, self.zero = config, mesh, int(zero)
        self.microbatches, self.sequence_parallel = microbatches, sequence_parallel
        self.dense_names = [name for name, _ in gpt.named_parameters()]
        dense_stages = stages_for_rank(gpt, mesh.pp_rank, mesh.pp, chunks, balance)
        self.stages = [TensorParallelStage(stage, mesh.tp_group, sequence_parallel, seed) for stage in dense_stages]
        self.pipeline = Pipeline(self.stages, mesh.pp_group, microbatches, schedule, checkpoint_activations)
        # The dp mean goes through the reducer's buckets, last parameters first; under ZeRO-1
        # the optimizer reduce-scatters instead (ZeroOptimizer docstring), and broadcasts.
        self.dp_reducer, self.shardings = None, []
        if self.zero != 1:
            broadcast_parameters(self.parameters(), mesh.dp_group)  # the replicas start as one model
            trainable = [p for p in self.parameters() if p.requires_grad]
            if self.zero == 0:
                self.dp_reducer = Reducer(trainable[::-1], mesh.dp_group)
            else:
                self.shard_units(prefetch)
        self.optimizer = None
        self.accumulated = 0  # global batches whose gradients .grad holds
        self.synced = False

    def shard_units(self, prefetch):
        """ZeRO-2/3: one reduce-scatter bucket per unit of each stage (FSDP's units serve both
        stages), the last stage's last unit first; ZeRO-3 also shards the units' parameters."""
        units = [[(name, [p for p in module.parameters() if p.requires_grad]) for name, module in stage_units(stage)]
                 for stage in self.stages]
        units = [[(name, params) for name, params in chunk if params] for chunk in units]
        self.dp_reducer = ShardedReducer([], self.mesh.dp_group,
                                         param_lists=[params for chunk in units for _, params in chunk][::-1])
        if self.zero == 2:
            return
        buckets = self.dp_reducer.buckets[::-1]
        for stage, chunk in zip(self.stages, units):
            mine, buckets = buckets[:len(chunk)], buckets[len(chunk):]
            sharding = Sharding([name for name, _ in chunk], mine, self.mesh.dp_group, prefetch)
            modules = dict(stage_units(stage))
            for unit in sharding.units:
                fully_shard(modules[unit.name], sharding, unit)
            fully_shard(stage, sharding)
            self.shardings.append(sharding)

    @contextlib.contextmanager
    def full_parameters(self, writeback=False):
        """ZeRO-3: every parameter gathered for the block (written back to the shards after, if
        writeback); otherwise nothing to do."""
        with contextlib.ExitStack() as stack:
            for sharding in self.shardings:
                stack.enter_context(sharding.full_parameters(writeback))
            yield

    def layout(self):
        return {"dp": self.mesh.dp, "tp": self.mesh.tp, "pp": self.mesh.pp, "microbatches": self.microbatches,
                "schedule": self.pipeline.schedule, "chunks": self.pipeline.v,
                "checkpoint_activations": self.pipeline.checkpoint, "sequence_parallel": self.sequence_parallel,
                "zero": self.zero}

    # --- parameters --------------------------------------------------------------

    def named_parameters(self):
        """This rank's parameters under single-device names (shards carry tp_axis, full_shape)."""
        return self.pipeline.named_parameters()

    def named_modules(self):
        return [item for i, stage in enumerate(self.stages) for item in stage.named_modules(f"stages.{i}")]

    def configure_optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        """AdamW on this rank's parameters, or ZeRO AdamW sharded over dp; kept as `self.optimizer`."""
        if self.zero:
            buckets = self.dp_reducer.buckets if self.zero > 1 else None
            self.optimizer = ZeroOptimizer(self.parameters(), self.mesh.dp_group, lr, betas, eps, weight_decay,
                                           self.zero, buckets)
        else:
            self.optimizer = AdamW(self.parameters(), lr, betas, eps, weight_decay)
        return self.optimizer

    # --- training ------------------------------------------------------------------

    def local_batch(self, idx, targets):
        """This dp rank's rows of the global batch, after checking every size on every rank."""
        idx, targets = np.asarray(idx), np.asarray(targets)
        if idx.ndim != 2 or targets.shape != idx.shape:
            raise ValueError(f"train_step needs idx and targets of the same shape (B, T), "
                             f"got {idx.shape} and {targets.shape}")
        (batch, seq), dp, m, tp = idx.shape, self.mesh.dp, self.microbatches, self.mesh.tp
        if batch % (dp * m):
            raise ValueError(f"global batch {batch} is not divisible by dp={dp} x microbatches={m} = {dp * m}")
        if seq > self.config.block_size:
            raise ValueError(f"sequence length {seq} exceeds block_size {self.config.block_size}")
        if self.sequence_parallel and seq % tp:
            raise ValueError(f"sequence parallelism needs the sequence length {seq} divisible by tp={tp}")
        rows = slice(self.mesh.dp_rank * batch // dp, (self.mesh.dp_rank + 1) * batch // dp)
        return idx[rows], targets[rows]

    def train_step(self, idx, targets):
        """Forward and backward of one global batch (B, T); its gradient ADDS to `.grad`.
        Returns the mean loss over the global batch, on every rank."""
        if self.synced:
            raise RuntimeError("train_step after the gradients were synced: call optimizer_step() or "
                               "zero_grad() before accumulating more")
        idx, targets = self.local_batch(idx, targets)
        loss = self.pipeline.train_step(idx, targets, zero_grad=False)
        self.accumulated += 1
        return float(self.mesh.dp_group.all_reduce(np.array([loss]))[0]) / self.mesh.dp

    def finish_grad_sync(self):
        """TP partial grads summed over tp, the mean over accumulated batches, then the dp
        mean (left to the optimizer under ZeRO). Idempotent; every rank must call it alike."""
        if self.synced or not self.accumulated:
            return
        for stage in self.stages:
            stage.finish_grad_sync()
        if self.accumulated > 1:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad /= self.accumulated
        for sharding in self.shardings:
            sharding.finish()
        if self.dp_reducer is not None:
            self.dp_reducer.finish()
        self.synced = True

    def optimizer_step(self):
        """Finish the gradient sync, step the optimizer, zero the gradients."""
        if self.optimizer is None:
            raise RuntimeError("optimizer_step() before configure_optimizer()")
        self.finish_grad_sync()
        self.optimizer.step()
        self.zero_grad()

    def zero_grad(self):
        self.pipeline.zero_grad()
        if self.zero > 1:
            self.dp_reducer.zero_grad_shards()
        self.accumulated, self.synced = 0, False

    # --- the dense, single-device view (collectives over the whole mesh) -----------

    def _merge(self, local):
        """Each stage's tp-gathered arrays merged over pp, in single-device name order."""
        merged = gather_named_arrays(self.mesh.pp_group, local)
        return {name: merged[name] for name in self.dense_names if name in merged}

    def full_state_dict(self):
        local = {}
        with self.full_parameters():
            for stage in self.stages:
                local.update(stage.full_state_dict())
        return self._merge(local)

    def full_grads(self):
        """Single-device-named gradients of the synced step (finishes the sync first);
        under ZeRO-1 the dp mean is taken here, since the raw gradients are still local;
        under ZeRO-2/3 every rank's chunk is gathered."""
        self.finish_grad_sync()
        params = self.parameters()
        if self.zero > 1:  # the averaged gradients, whole, only for this call
            grads = gather_grad_shards(self.dp_reducer.buckets, self.mesh.dp_group)
            for p in params:
                p.grad = grads.get(id(p))
        local = {}
        with self.full_parameters():
            for stage in self.stages:
                local.update(stage.full_grads())
        if self.zero > 1:
            for p in params:
                p.grad = None
        if self.zero == 1:
            local = {name: self.mesh.dp_group.all_reduce(g) / self.mesh.dp for name, g in local.items()}
        return self._merge(local)

    def load_full_state_dict(self, state):
        """Load single-device-named parameters: each rank keeps its stages' shards."""
        missing = [name for name in self.dense_names if name not in state]
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing}")
        with self.full_parameters(writeback=True):
            for stage in self.stages:
                names = [name for name, _ in stage.named_parameters()]
                stage.load_full_state_dict({name: state[name] for name in names})

    def events(self):
        return self.pipeline.events

    # --- what the layout costs -------------------------------------------------------

    def memory_bytes(self):
        """Bytes this rank holds now, measured from the live arrays (each buffer once; a ZeRO-3
        placeholder none): {"params", "grads", "optim", "gathered"}; "gathered" is the peak of
        ZeRO-3's all-gathered units since the last reset_memory_peak()."""
        params = self.parameters()
        buckets = self.dp_reducer.buckets if self.zero > 1 else []
        return {"params": held_bytes([p.data for p in params] + [b.param_shard for b in buckets if self.zero == 3]),
                "grads": held_bytes([p.grad for p in params if p.grad is not None] + [b.grad_shard for b in buckets]),
                "optim": self.optimizer.state_bytes() if self.optimizer else 0,
                "gathered": max([s.peak_gathered_bytes for s in self.shardings], default=0)}

    def reset_memory_peak(self):
        for sharding in self.shardings:
            sharding.reset_peak()

    def groups(self):
        """The groups that communicate; under ZeRO-3 also the dp copies the parameter gathers use."""
        groups = {"dp": self.mesh.dp_group, "tp": self.mesh.tp_group, "pp": self.mesh.pp_group}
        groups.update({f"dp-params.{i}": sharding.group for i, sharding in enumerate(self.shardings)})
        return groups

    def communication_stats(self):
        """{(group name, kind): {calls, elements, bytes}} on this rank since the last reset.
        A group of one rank is left out: its collectives move nothing. ZeRO-3's parameter
        gathers (on copies of the dp group) count as dp."""
        stats = {}
        for name, group in self.groups().items():
            for kind, counts in (group.stats().items() if group.size > 1 else ()):
                into = stats.setdefault((name.split("-")[0], kind), dict.fromkeys(counts, 0))
                for count, value in counts.items():
                    into[count] += value
        return stats

    def reset_communication_stats(self):
        for group in self.groups().values():
            group.reset_stats()


def stage_units(stage):
    """[(single-device name, module)] of a pipeline stage's ZeRO-3 units, in forward order."""
    first = [("tok_emb", stage.tok_emb), ("pos_emb", stage.pos_emb)] if stage.is_first else []
    last = [("ln_f", stage.ln_f), ("lm_head", stage.lm_head)] if stage.is_last else []
    return first + [(f"blocks.{i}", stage.blocks[i]) for i in stage.blocks.indices()] + last
