"""3D parallelism: data × tensor × pipeline over a `Mesh(dp, tp, pp)` (Megatron-LM's PTD-P).

    global batch (B, T) ──split over dp──▶ this dp rank's rows (B/dp, T)
        ──pipeline over pp──▶ m micro-batches through this rank's stage(s), any schedule;
                              each stage's parts are tensor parallel over tp
                              (heads, MLP columns, vocabulary; SP: the sequence between them)
        ──gradients──▶ TP: sum the sequence-parallel partial grads over tp
                       DP: average over dp (DataParallel's buckets; under ZeRO-1 the
                           optimizer's reduce-scatter does it)
        ──optimizer──▶ AdamW on this rank's shards, or ZeroOptimizer over dp

Precision (`precision="fp16"` or `"bf16"`, minitensor.amp): the stages compute in 16 bits;
the optimizer, the dp reduction (on the masters' gradients: float32) and checkpoints
see the float32 master weights; the loss is scaled on the last stage; the found-inf
flag is MAX-all-reduced over tp, pp and dp, so every rank skips the same steps.

Every rank runs this same code on its own cell of the grid. Nothing here is new
mechanism, only composition: `stages_for_rank` cuts the dense GPT into this rank's
pipeline stages, `TensorParallelStage` converts each over the tp group, `Pipeline` runs
them over the pp group, and the gradient `Reducer` (or `ZeroOptimizer`) spans the dp group.

Gradient accumulation: `train_step` ADDS the gradient of one global batch to `.grad`;
`optimizer_step()` first finishes the sync (dividing by the number of accumulated
batches, so the step sees the gradient of their mean loss), then steps and zeroes.
"""
import numpy as np

from minitensor.amp import MixedPrecision, policy_of_dtype, precision_policy
from minitensor.optim import AdamW

from .comm.gather import gather_named_arrays
from .data_parallel import broadcast_parameters
from .model import ParallelModel
from .pipeline.executor import Pipeline
from .pipeline.partition import stages_for_rank
from .reducer import Reducer
from .tensor_parallel import TensorParallelStage
from .zero import ZeroOptimizer


class HybridGPT(ParallelModel):
    """This rank's part of `gpt` under the 3D layout `mesh` (every rank passes the same dense GPT).

    microbatches: m per global batch and dp rank; schedule: "gpipe", "1f1b",
    "interleaved" (with `chunks` = v model chunks per pp rank) or the zero-bubble
    "zb-h1" / "zb-h2" (pipeline.zero_bubble); balance: blocks per
    pipeline stage (default: by parameter count); sequence_parallel, checkpoint_activations,
    zero (ZeRO-1 optimizer over dp): switches; seed: the TP dropout streams; precision: a
    minitensor.amp policy name ("fp32", "fp16", "bf16", ...; `gpt` is built in its master
    dtype), default the gpt's own dtype throughout; scaler: GradScaler settings.
    """

    def __init__(self, gpt, mesh, microbatches=1, schedule="1f1b", chunks=1, balance=None,
                 sequence_parallel=False, checkpoint_activations=False, zero=False, seed=0, precision=None,
                 scaler=None):
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
        # Under a mixed policy the optimizer and the dp reducer work on the float32 masters.
        self.dp_reducer = None
        if not zero:
            broadcast_parameters(self.parameters(), mesh.dp_group)  # the replicas start as one model
        policy = precision_policy(precision) if precision else policy_of_dtype(self.parameters()[0].dtype)
        self.amp = MixedPrecision(self.parameters(), policy, groups=(mesh.tp_group, mesh.pp_group, mesh.dp_group),
                                  **(scaler or {}))
        if not zero:
            trainable = [p for p in self.amp.masters if p.requires_grad]
            self.dp_reducer = Reducer(trainable[::-1], mesh.dp_group)
        self.optimizer = None
        self.accumulated = 0  # global batches whose gradients .grad holds
        self.synced = False

    def layout(self):
        return {"dp": self.mesh.dp, "tp": self.mesh.tp, "pp": self.mesh.pp, "microbatches": self.microbatches,
                "schedule": self.pipeline.schedule, "chunks": self.pipeline.v,
                "checkpoint_activations": self.pipeline.checkpoint, "sequence_parallel": self.sequence_parallel,
                "zero": self.zero, "precision": self.amp.policy.name}

    # --- parameters --------------------------------------------------------------

    def named_parameters(self):
        """This rank's parameters under single-device names (shards carry tp_axis, full_shape)."""
        return self.pipeline.named_parameters()

    def named_master_parameters(self):
        """The parameters the optimizer steps, under single-device names: the float32 masters
        under a mixed policy (with the shards' tags), else named_parameters() itself."""
        return [(name, m) for (name, _), m in zip(self.named_parameters(), self.amp.masters)]

    def master_parameters_changed(self):
        """A loader wrote the masters: round them into the compute copies."""
        self.amp.masters_to_params()

    def named_modules(self):
        return [item for i, stage in enumerate(self.stages) for item in stage.named_modules(f"stages.{i}")]

    def configure_optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        """AdamW on this rank's (master) parameters, or ZeRO-1 AdamW sharded over dp; kept as `self.optimizer`."""
        if self.zero:
            self.optimizer = ZeroOptimizer(self.amp.masters, self.mesh.dp_group, lr, betas, eps, weight_decay)
            self.amp.masters_to_params()  # it broadcast rank 0's masters: the compute copies follow
        else:
            self.optimizer = AdamW(self.amp.masters, lr, betas, eps, weight_decay)
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
        self.pipeline.loss_scale = self.amp.scaler.scale
        loss = self.pipeline.train_step(idx, targets, zero_grad=False)
        self.accumulated += 1
        return float(self.mesh.dp_group.all_reduce(np.array([loss]))[0]) / self.mesh.dp

    def finish_grad_sync(self):
        """TP partial grads summed over tp, the mean over accumulated batches (into the float32
        masters under a mixed policy), then the dp mean (left to the optimizer under ZeRO).
        Idempotent; every rank must call it alike."""
        if self.synced or not self.accumulated:
            return
        for stage in self.stages:
            stage.finish_grad_sync()
        self.amp.grads_to_master(divisor=self.accumulated)
        if self.dp_reducer is not None:
            self.dp_reducer.finish()
        self.synced = True

    def optimizer_step(self):
        """Finish the gradient sync, step the optimizer, zero the gradients."""
        if self.optimizer is None:
            raise RuntimeError("optimizer_step() before configure_optimizer()")
        self.finish_grad_sync()
        self.amp.step(self.optimizer)  # skipped on every rank if any rank's gradients overflowed
        self.zero_grad()

    def zero_grad(self):
        self.pipeline.zero_grad()
        self.amp.zero_grad()
        self.accumulated, self.synced = 0, False

    # --- the dense, single-device view (collectives over the whole mesh) -----------

    def _merge(self, local):
        """Each stage's tp-gathered arrays merged over pp, in single-device name order."""
        merged = gather_named_arrays(self.mesh.pp_group, local)
        return {name: merged[name] for name in self.dense_names if name in merged}

    def full_state_dict(self):
        """Single-device-named parameters (the masters under a mixed policy)."""
        local = {}
        with self.amp.params_hold_masters():
            for stage in self.stages:
                local.update(stage.full_state_dict())
        return self._merge(local)

    def full_grads(self):
        """Single-device-named gradients of the synced step (finishes the sync first), unscaled,
        in the master dtype; under ZeRO the dp mean is taken here (the raw gradients are still local)."""
        self.finish_grad_sync()
        local = {}
        with self.amp.params_hold_masters():
            for stage in self.stages:
                local.update(stage.full_grads())
        local = {name: g / self.amp.scaler.scale for name, g in local.items()} if self.amp.scaler.enabled else local
        if self.zero:
            local = {name: self.mesh.dp_group.all_reduce(g) / self.mesh.dp for name, g in local.items()}
        return self._merge(local)

    def load_full_state_dict(self, state):
        """Load single-device-named parameters: each rank keeps its stages' shards."""
        missing = [name for name in self.dense_names if name not in state]
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing}")
        with self.amp.params_hold_masters():
            for stage in self.stages:
                names = [name for name, _ in stage.named_parameters()]
                stage.load_full_state_dict({name: state[name] for name in names})

    def events(self):
        return self.pipeline.events

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
