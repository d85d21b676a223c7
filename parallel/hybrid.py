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
mechanism, only composition: `stages_for_rank` cuts the dense GPT into this rank's
pipeline stages, `TensorParallelStage` converts each over the tp group, `Pipeline` runs
them over the pp group, and the gradient `Reducer` (or `ZeroOptimizer`) spans the dp group.

Gradient accumulation: `train_step` ADDS the gradient of one global batch to `.grad`;
`optimizer_step()` first finishes the sync (dividing by the number of accumulated
batches, so the step sees the gradient of their mean loss), then steps and zeroes.
"""
import numpy as np

from minitensor.optim import AdamW

from .comm.gather import gather_named_arrays
from .data_parallel import broadcast_parameters
from .local_sgd import DiLoCo
from .model import ParallelModel
from .pipeline.executor import Pipeline
from .pipeline.partition import stages_for_rank
from .pipeline.timeline import Event
from .reducer import Reducer
from .tensor_parallel import TensorParallelStage
from .zero import ZeroOptimizer


class HybridGPT(ParallelModel):
    """This rank's part of `gpt` under the 3D layout `mesh` (every rank passes the same dense GPT).

    microbatches: m per global batch and dp rank; schedule: "gpipe", "1f1b",
    "interleaved" (with `chunks` = v model chunks per pp rank) or the zero-bubble
    "zb-h1" / "zb-h2" (pipeline.zero_bubble); balance: blocks per
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
        dense_stages = stages_for_rank(gpt, mesh.pp_rank, mesh.pp, chunks, balance)
        self.stages = [TensorParallelStage(stage, mesh.tp_group, sequence_parallel, seed) for stage in dense_stages]
        self.pipeline = Pipeline(self.stages, mesh.pp_group, microbatches, schedule, checkpoint_activations)
        # The dp mean goes through the reducer's buckets, last parameters first; under ZeRO
        # the optimizer reduce-scatters instead (ZeroOptimizer docstring), and broadcasts.
        self.dp_reducer = None
        if not zero:
            broadcast_parameters(self.parameters(), mesh.dp_group)  # the replicas start as one model
            trainable = [p for p in self.parameters() if p.requires_grad]
            self.dp_reducer = Reducer(trainable[::-1], mesh.dp_group)
        self.optimizer = None
        self.comm_hook = None  # the dp gradient compressor, with register_comm_hook (its state is checkpointed)
        self.outer = None  # DiLoCo's outer optimizer, with configure_local_sgd: no dp reduction per step
        self.accumulated = 0  # global batches whose gradients .grad holds
        self.synced = False

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
        """AdamW on this rank's parameters, or ZeRO-1 AdamW sharded over dp; kept as `self.optimizer`."""
        if self.zero:
            self.optimizer = ZeroOptimizer(self.parameters(), self.mesh.dp_group, lr, betas, eps, weight_decay)
        else:
            self.optimizer = AdamW(self.parameters(), lr, betas, eps, weight_decay)
        return self.optimizer

    def register_comm_hook(self, hook):
        """Reduce the dp gradients through `hook` (parallel.comm_hooks), not a plain all-reduce."""
        if self.dp_reducer is None:
            raise ValueError("a communication hook compresses the dp all-reduce, which ZeRO-1 replaces by its "
                             "reduce-scatter: use one or the other")
        self.dp_reducer.register_comm_hook(hook)
        self.comm_hook = hook

    def configure_local_sgd(self, local_steps, outer_lr=0.7, outer_momentum=0.9):
        """Local SGD / DiLoCo over dp (parallel.local_sgd): no dp reduction per step; every
        `local_steps` optimizer steps the replicas average their pseudo-gradients."""
        if self.dp_reducer is None:
            raise ValueError("local SGD averages whole replicas over dp; ZeRO-1 shards the optimizer over dp: "
                             "use one or the other")
        self.outer = DiLoCo(self.dp_reducer, local_steps, outer_lr, outer_momentum)

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
        if self.dp_reducer is not None and self.outer is None:
            self.dp_reducer.finish()
        self.synced = True

    def optimizer_step(self):
        """Finish the gradient sync, step the optimizer, zero the gradients."""
        if self.optimizer is None:
            raise RuntimeError("optimizer_step() before configure_optimizer()")
        self.finish_grad_sync()
        self.optimizer.step()
        if self.outer is not None:
            self.outer.step()  # every local_steps-th step: the dp average of the pseudo-gradients
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
            local.update(stage.full_state_dict())
        return self._merge(local)

    def full_grads(self):
        """Single-device-named gradients of the synced step (finishes the sync first);
        under ZeRO the dp mean is taken here, since the raw gradients are still local."""
        self.finish_grad_sync()
        local = {}
        for stage in self.stages:
            local.update(stage.full_grads())
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
            stage.load_full_state_dict({name: state[name] for name in names})

    def events(self):
        """The pipeline's actions of the last step and the dp buckets' communication spans
        ("dp_bucket", numbered by bucket), on the pipeline's clock."""
        buckets = []
        if self.dp_reducer is not None and self.pipeline.events:
            t0, rank = self.pipeline.t0, self.pipeline.events[0].rank
            buckets = [Event(rank, "dp_bucket", index, 0, start - t0, end - t0)
                       for index, start, end in self.dp_reducer.spans if end is not None]
        return self.pipeline.events + buckets

    # --- what the layout costs -------------------------------------------------------

    def groups(self):
        return {"dp": self.mesh.dp_group, "tp": self.mesh.tp_group, "pp": self.mesh.pp_group}

    def communication_stats(self):
        """{(group name, kind): {calls, elements, bytes}} on this rank since the last reset.
        A group of one rank is left out: its collectives move nothing."""
        return {(name, kind): counts for name, group in self.groups().items() if group.size > 1
                for kind, counts in group.stats().items()}

    def reset_communication_stats(self):
        for group in self.groups().values():
            group.reset_stats()
