"""3D parallelism: data × tensor × pipeline over a `Mesh(dp, tp, pp)` (Megatron-LM's PTD-P).

    global batch (B, T) ──split over dp──▶ this dp rank's rows (B/dp, T)
        ──pipeline over pp──▶ m micro-batches through this rank's stage(s), any schedule;
                              each stage's parts are tensor parallel over tp
                              (heads, MLP columns, vocabulary; SP: the sequence between them)
        ──gradients──▶ TP: sum the sequence-parallel partial grads over tp
                       DP: average over dp (DataParallel's buckets; under ZeRO-1 the
                           optimizer's reduce-scatter does it)
        ──optimizer──▶ AdamW on this rank's shards, or ZeroOptimizer over dp

Every rank runs this same code on its own cell of the grid. Nothing here is new
mechanism: a `TensorParallelStage` is a `PipelineStage` whose parts went through the
per-part TP conversion; `Pipeline` runs those stages over the pp group; `DataParallel`
(inside `no_sync`, finished once after the schedule) or `ZeroOptimizer` spans the dp group.

Gradient accumulation: `train_step` ADDS the gradient of one global batch to `.grad`;
`optimizer_step()` first finishes the sync (dividing by the number of accumulated
batches, so the step sees the gradient of their mean loss), then steps and zeroes.
"""
import contextlib

import numpy as np

from minitensor.models.gpt import GPT
from minitensor.optim import AdamW

from .data_parallel import DataParallel
from .pipeline.executor import Pipeline
from .pipeline.gather import gather_named_arrays
from .pipeline.partition import balance_by_parameters, block_ranges, check_balance
from .pipeline.schedules import stage_of
from .pipeline.stage import PipelineStage
from .tensor_parallel import (TensorParallelRNG, parallel_embed, parallel_head, tensor_parallel_block,
                              tensor_parallel_embedding, tensor_parallel_head)
from .tensor_parallel.sharding import all_reduce_partial_grads, full_grads, full_state_dict, load_full_state_dict
from .zero import ZeroOptimizer

COMM_GROUPS = ("dp", "tp", "pp")


class TensorParallelStage(PipelineStage):
    """Pipeline stage `stage` of `num_stages` with every part converted to TP over `group`.

    Same names as the dense stage (`blocks.{global index}.*`); sharded parameters carry
    `tp_axis` and `full_shape`. Under sequence parallelism the activation passed between
    stages is this tp rank's slice of the sequence, (B, T/tp, C)."""

    embed = parallel_embed
    head = parallel_head

    def __init__(self, model, block_range, stage, num_stages, group, sequence_parallel=False, seed=0):
        super().__init__(model, block_range, stage, num_stages)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.rng = TensorParallelRNG(seed + stage, group.rank)  # dropout streams of this stage
        if self.is_first:
            for name, part in tensor_parallel_embedding(model, group, self.rng, sequence_parallel).items():
                setattr(self, name, part)
        for index in block_range:
            self.blocks[index] = tensor_parallel_block(model.blocks[index], group, self.rng, sequence_parallel)
        if self.is_last:
            for name, part in tensor_parallel_head(model, group, sequence_parallel).items():
                setattr(self, name, part)
        self.train(model.training)

    def generators(self):
        return self.rng.generators()

    def activation_shape(self, batch, seq_len):
        if self.sequence_parallel:
            seq_len //= self.group.size
        return (batch, seq_len, self.config.d_model)


class HybridGPT:
    """This rank's part of `gpt` under the 3D layout `mesh` (every rank passes the same dense GPT).

    microbatches: m per global batch and dp rank; schedule: "gpipe", "1f1b" or
    "interleaved" (with `chunks` = v model chunks per pp rank); balance: blocks per
    pipeline stage (default: by parameter count); sequence_parallel, checkpoint_activations,
    zero (ZeRO-1 optimizer over dp): switches; seed: the TP dropout streams.
    """

    def __init__(self, gpt, mesh, microbatches=1, schedule="1f1b", chunks=1, balance=None,
                 sequence_parallel=False, checkpoint_activations=False, zero=False, seed=0):
        config = gpt.config
        if config.n_head % mesh.tp:
            raise ValueError(f"n_head={config.n_head} is not divisible by tp={mesh.tp}")
        self.config, self.mesh, self.zero = config, mesh, zero
        self.microbatches, self.sequence_parallel = microbatches, sequence_parallel
        self.dense_names = [name for name, _ in gpt.named_parameters()]
        num_stages = mesh.pp * chunks
        balance = balance_by_parameters(gpt, num_stages) if balance is None else list(balance)
        check_balance(balance, config.n_layer, num_stages)
        ranges = block_ranges(balance)
        self.stage_ids = [stage_of(mesh.pp_rank, chunk, mesh.pp) for chunk in range(chunks)]
        self.stages = [TensorParallelStage(gpt, ranges[s], s, num_stages, mesh.tp_group, sequence_parallel, seed)
                       for s in self.stage_ids]
        self.pipeline = Pipeline(self.stages, mesh.pp_group, microbatches, schedule, checkpoint_activations)
        # Under ZeRO the optimizer owns the dp communication (ZeroOptimizer docstring).
        self.data_parallel = None if zero else DataParallel(self.pipeline, mesh.dp_group)
        self.optimizer = None
        self.accumulated = 0  # global batches whose gradients .grad holds
        self.synced = False

    # --- parameters --------------------------------------------------------------

    def named_parameters(self):
        """This rank's parameters under single-device names (shards carry tp_axis, full_shape)."""
        return self.pipeline.named_parameters()

    def parameters(self):
        return self.pipeline.parameters()

    def num_parameters(self):
        return sum(p.size for p in self.parameters())

    def configure_optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        """AdamW on this rank's parameters, or ZeRO-1 AdamW sharded over dp; kept as `self.optimizer`."""
        if self.zero:
            self.optimizer = ZeroOptimizer(self.parameters(), self.mesh.dp_group, lr, betas, eps, weight_decay)
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

    def no_sync(self):
        return contextlib.nullcontext() if self.data_parallel is None else self.data_parallel.no_sync()

    def train_step(self, idx, targets):
        """Forward and backward of one global batch (B, T); its gradient ADDS to `.grad`.
        Returns the mean loss over the global batch, on every rank."""
        if self.synced:
            raise RuntimeError("train_step after the gradients were synced: call optimizer_step() or "
                               "zero_grad() before accumulating more")
        idx, targets = self.local_batch(idx, targets)
        with self.no_sync():
            loss = self.pipeline.train_step(idx, targets, zero_grad=False)
        self.accumulated += 1
        return float(self.mesh.dp_group.all_reduce(np.array([loss]))[0]) / self.mesh.dp

    def finish_grad_sync(self):
        """TP partial grads summed over tp, the mean over accumulated batches, then the dp
        mean (left to the optimizer under ZeRO). Idempotent; every rank must call it alike."""
        if self.synced or not self.accumulated:
            return
        for stage in self.stages:
            all_reduce_partial_grads(stage, self.mesh.tp_group)
        if self.accumulated > 1:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad /= self.accumulated
        if self.data_parallel is not None:
            self.data_parallel.finish_grad_sync()
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
        self.accumulated, self.synced = 0, False

    # --- the dense, single-device view (collectives over the whole mesh) -----------

    def _merge(self, local):
        """Each stage's tp-gathered arrays merged over pp, in single-device name order."""
        merged = gather_named_arrays(self.mesh.pp_group, local)
        return {name: merged[name] for name in self.dense_names if name in merged}

    def full_state_dict(self):
        local = {}
        for stage in self.stages:
            local.update(full_state_dict(stage, self.mesh.tp_group))
        return self._merge(local)

    def full_grads(self):
        """Single-device-named gradients of the synced step (finishes the sync first);
        under ZeRO the dp mean is taken here, since the raw gradients are still local."""
        self.finish_grad_sync()
        local = {}
        for stage in self.stages:
            local.update(full_grads(stage, self.mesh.tp_group))
        if self.zero:
            local = {name: self.mesh.dp_group.all_reduce(g) / self.mesh.dp for name, g in local.items()}
        return self._merge(local)

    def load_full_state_dict(self, state):
        """Load single-device-named parameters: each rank keeps its stages' shards."""
        missing = [name for name in self.dense_names if name not in state]
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing}")
        for stage in self.stages:
            names = [name for name, _ in stage.named_parameters()]
            load_full_state_dict(stage, self.mesh.tp_group, {name: state[name] for name in names})

    def dense_gpt(self):
        """A single-device GPT holding the gathered parameters (on every rank)."""
        dtype = self.parameters()[0].dtype
        model = GPT(self.config, dtype=dtype)
        model.load_state_dict(self.full_state_dict())
        return model.eval()

    # --- what the layout costs -------------------------------------------------------

    def groups(self):
        return {"dp": self.mesh.dp_group, "tp": self.mesh.tp_group, "pp": self.mesh.pp_group}

    def communication_stats(self):
        """{(group name, kind): {calls, elements, bytes}} on this rank since the last reset."""
        return {(name, kind): counts for name, group in self.groups().items()
                for kind, counts in group.stats().items()}

    def reset_communication_stats(self):
        for group in self.groups().values():
            group.reset_stats()
