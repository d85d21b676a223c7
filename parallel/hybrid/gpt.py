"""3D parallelism: data × tensor × pipeline over a `Mesh(dp, tp, pp)` (Megatron-LM's PTD-P),
and the fourth axis, context parallelism over cp.

    global batch (B, T) ──split over dp──▶ this dp rank's rows (B/dp, T)
        ──split over cp──▶ this cp rank's tokens (B/dp, T/cp): zigzag or contiguous chunks
                           (context_parallel.layout); attention is a ring over the cp group
        ──pipeline over pp──▶ m micro-batches through this rank's stage(s), any schedule;
                              each stage's parts are tensor parallel over tp
                              (heads, MLP columns, vocabulary; SP: the sequence between them)
        ──gradients──▶ TP: sum the sequence-parallel partial grads over tp
                       tied: sum BERT's embedding copies over the first and last stage
                       mirrored: under DualPipe sum each stage's two copies over pp ranks r, pp-1-r
                       replicas: average over dp × cp (a mixture of experts' experts over
                           edp), as the replica synchronisation picked by the ZeRO stage does
                           it (replicas.py): all-reduced buckets; ZeRO-1's optimizer
                           reduce-scatter; ZeRO-2/3's reduce-scatters that keep this rank's
                           chunk. Every cp rank's gradient is that of the mean loss over its tokens
        ──optimizer──▶ AdamW on this rank's shards, or ZeroOptimizer over the replicas

ZeRO-3 (`zero=3`) also shards each pipeline stage's parameters over dp, per unit (the
token and position embeddings, each block, ln_f, the lm_head; fully_sharded.py): a
unit is all-gathered for each micro-batch's forward and backward and freed after (a
BERT's MLM head, which reads the tied token embedding's weight, gathers that unit too:
the model's `tied_reads`). Under ZeRO-2/3 a unit's reduce-scatter starts (non-blocking)
inside backward, as soon as its gradients are final, and all are finished at the end of
each global batch (zero_units.py, `ShardedGradients` and `ShardedParameters`).

Precision (`precision="fp16"` or `"bf16"`, minitensor.amp): the stages compute in 16 bits;
the optimizer, the dp reduction (on the masters' gradients: float32) and checkpoints
see the float32 master weights; the loss is scaled on the last stage; the found-inf
flag is MAX-all-reduced over tp, pp and dp × cp, so every rank skips the same steps.
Under ZeRO-2/3 the masters exist only as the shards: each flat bucket keeps this rank's
chunk of the float32 masters (`param_shard`, which ZeroOptimizer steps beside its float32
moments) and of their float32 gradient (`grad_shard`); ZeRO-3 gathers a 16-bit copy of
the chunk (`compute_shard`), ZeRO-2 all-gathers the rounded chunks into the 16-bit
parameters after each step. Per parameter and rank: 2 + 4 + 12 bytes / (dp × cp) under
ZeRO-3 (16-bit chunk, float32 gradient chunk, float32 master and moments; 2 + 4 + 8 with the
policy's moment_dtype "bfloat16": AdamW's moments in bfloat16, minitensor.narrow_moments).
Under an FP8 recipe (`precision="fp8-current"`, `"fp8-delayed"` or `"fp8-blockwise"`, minitensor.fp8)
the blocks' linears multiply FP8 operands, a mixture of experts' experts too (not its router); the
amaxes are MAX-reduced over tp and dp × cp (a routed expert's over tp and edp): once per step under
delayed scaling, at every cast under current scaling, so every layout casts with one device's scales.

Every rank runs this same code on its own cell of the grid. Nothing here is new
mechanism, only composition: `stages_for_rank` cuts the dense GPT into this rank's
pipeline stages, `TensorParallelStage` converts each over the tp group, `Pipeline` runs
them over the pp group, `ContextParallel` gives each stage its tokens and ring attention,
and one replica synchronisation (`REPLICA_SYNCS`, chosen once by the ZeRO stage) makes
the replicas over dp × cp one model again. The model never asks which one it holds.

Gradient accumulation: `train_step` ADDS the gradient of one global batch to `.grad`;
`optimizer_step()` first finishes the sync (dividing by the number of accumulated
batches, so the step sees the gradient of their mean loss), then steps and zeroes.
"""
import numpy as np

from minitensor.amp import MixedPrecision, PrecisionPolicy, policy_of_dtype, precision_policy
from minitensor.nn.moe import MoE

from ..context_parallel import ContextParallel
from ..expert_parallel import shard_experts
from ..pipeline.executor import Pipeline
from ..pipeline.partition import stages_for_rank
from ..pipeline.registry import placement_of
from ..pipeline.tied import copies_to_sum
from ..tensor_parallel import TensorParallelStage
from .accounting import LayoutAccounting
from .dense_view import DenseView
from .parallel_model import ParallelModel
from .replicas import AllReduceReplicas, ModelParts, ShardedMoments
from .zero_units import ShardedGradients, ShardedParameters

# How the replicas synchronise, by ZeRO stage: chosen once, when the model is built (replicas.py).
REPLICA_SYNCS = {0: AllReduceReplicas, 1: ShardedMoments, 2: ShardedGradients, 3: ShardedParameters}


class HybridGPT(DenseView, LayoutAccounting, ParallelModel):
    """This rank's part of `gpt` under the 3D layout `mesh` (every rank passes the same dense GPT,
    or the same dense BERT: the same blocks, other ends).

    microbatches: m per global batch and dp rank; schedule: "gpipe", "1f1b",
    "interleaved" (with `chunks` = v model chunks per pp rank), the zero-bubble
    "zb-h1" / "zb-h2" (pipeline.zero_bubble) or "dualpipev" / "dualpipe" (chunks = 2, pipeline.dualpipe); balance: blocks per
    pipeline stage (default: by parameter count); sequence_parallel, recompute_activations:
    switches; zero: the ZeRO stage over dp × cp (0 or False: plain, 1 or True: sharded AdamW
    moments, 2: + gradients, 3: + parameters), which picks the replica synchronisation
    (REPLICA_SYNCS); prefetch: ZeRO-3 all-gathers issued ahead;
    seed: the TP dropout streams; cp_layout: "zigzag" or "contiguous", the tokens of each cp
    rank (with mesh.cp > 1); cp_comm_type: "p2p" (ring attention) or "a2a" (Ulysses: heads
    per tp rank divisible by cp); precision: a minitensor.amp policy or its name ("fp32", "fp16",
    "bf16", "fp8-delayed", ...; `gpt` is built in its master dtype), default the gpt's own dtype
    throughout; scaler: GradScaler settings.
    """

    def __init__(self, gpt, mesh, microbatches=1, schedule="1f1b", chunks=1, balance=None,
                 sequence_parallel=False, recompute_activations=False, zero=0, seed=0, prefetch=1,
                 cp_layout="zigzag", cp_comm_type="p2p", precision=None, scaler=None):
        config = gpt.config
        if config.n_head % mesh.tp:
            raise ValueError(f"n_head={config.n_head} is not divisible by tp={mesh.tp}")
        if int(zero) not in REPLICA_SYNCS:
            raise ValueError(f"zero={zero!r} is not a ZeRO stage 0, 1, 2 or 3")
        self.experts = getattr(config, "n_experts", 0)  # a BertConfig has no experts
        if self.experts % mesh.ep:
            raise ValueError(f"n_experts={self.experts} is not divisible by ep={mesh.ep}")
        ties = bool(set(gpt.first_parts) & set(gpt.last_parts))
        self.config, self.mesh, self.dense_class = config, mesh, type(gpt)
        self.microbatches, self.sequence_parallel = microbatches, sequence_parallel
        self.context = ContextParallel(mesh.cp_group, cp_layout, cp_comm_type) if mesh.cp > 1 else None
        self.dense_names = [name for name, _ in gpt.named_parameters()]
        if mesh.ep > 1:  # this rank keeps E/ep experts of each MoE layer (expert_parallel.dispatch)
            shard_experts(gpt, mesh.ep_group)
        placement = placement_of(schedule)
        dense_stages = stages_for_rank(gpt, mesh.pp_rank, mesh.pp, chunks, balance, placement)
        self.stages = [TensorParallelStage(stage, mesh.tp_group, sequence_parallel, seed, self.context)
                       for stage in dense_stages]
        self.pipeline = Pipeline(self.stages, mesh.pp_group, microbatches, schedule, recompute_activations)
        for moe in self.moe_layers():  # the balancing loss's tokens: a sequence over cp, a micro-batch over dp × cp
            moe.set_token_group_ranks(mesh.cp_group if mesh.cp > 1 else None,
                                      mesh.dp_cp_group if mesh.dp * mesh.cp > 1 else None)
        self.tied = copies_to_sum(self.stages, mesh, ties, placement, config.name)
        # Under a mixed policy the optimizer and the replicas' reductions work on the float32 masters.
        # An FP8 recipe's amaxes are MAX-reduced over the ranks holding parts of one tensor (tp, the
        # replicas: dp × cp, a routed expert's edp); a replica's gradients are dp·cp times the single
        # device's (minitensor.fp8.recipe).
        policy = (precision if isinstance(precision, PrecisionPolicy) else precision_policy(precision) if precision
                  else policy_of_dtype(self.parameters()[0].dtype))
        self.amp = MixedPrecision(self.parameters(), policy, groups=(mesh.tp_group, mesh.pp_group, mesh.dp_cp_group),
                                  model=self, amax_groups=(mesh.tp_group, mesh.dp_cp_group),
                                  grad_factor=mesh.dp * mesh.cp, expert_amax_groups=(mesh.tp_group, mesh.edp_group),
                                  **(scaler or {}))
        names = [name for name, _ in self.named_parameters()]
        parts = ModelParts(self.stages, self.tied, self.amp, mesh, names, microbatches, prefetch)
        self.replicas = REPLICA_SYNCS[int(zero)](parts)
        # State moved after each optimizer step outside the gradient (Module.step_updates: a MoE layer's
        # loss-free balancing bias), by single-device module name; each sums its counts over dp × cp.
        self.step_updates = [(name.split(".", 2)[2], update) for name, module in self.named_modules()
                             for update in module.step_updates(mesh.dp_cp_group)]
        self.optimizer = None
        self.accumulated = 0  # global batches whose gradients .grad holds
        self.synced = False

    @property
    def comm_hook(self):
        """The dp gradient compressor, with register_comm_hook (its state is checkpointed)."""
        return self.replicas.comm_hook

    @property
    def outer(self):
        """DiLoCo's outer optimizer, with configure_local_sgd: no dp reduction per step."""
        return self.replicas.outer

    def full_parameters(self, writeback=False):
        """A context in which every parameter holds its whole values (ZeRO-3 gathers them; under a
        mixed policy ZeRO-2/3 gather the float32 masters), written back to the shards with writeback."""
        return self.replicas.full_parameters(writeback)

    def layout(self):
        cp = ({"cp": self.mesh.cp, "cp_layout": self.context.layout, "cp_comm_type": self.context.comm_type}
              if self.context is not None else {})
        return {"dp": self.mesh.dp, "tp": self.mesh.tp, "pp": self.mesh.pp, **cp, "microbatches": self.microbatches,
                "schedule": self.pipeline.schedule, "chunks": self.pipeline.v,
                "recompute_activations": self.pipeline.recompute, "sequence_parallel": self.sequence_parallel,
                "zero": self.replicas.zero, "precision": self.amp.policy.name, **({"ep": self.mesh.ep} if self.experts else {})}

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

    def moe_layers(self):
        """This rank's MoE layers; each one's `load`, `dropped` (and under ep its
        dispatcher's `sent`, `received`) tell of its last forward."""
        return [block.mlp for stage in self.stages for block in stage.blocks if isinstance(block.mlp, MoE)]

    def named_modules(self):
        return [item for i, stage in enumerate(self.stages) for item in stage.named_modules(f"stages.{i}")]

    def configure_optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        """AdamW on this rank's (master) parameters, or ZeRO's AdamW sharded over the replicas, as
        the replica synchronisation makes it; kept as `self.optimizer`."""
        self.optimizer = self.replicas.optimizer(lr, betas, eps, weight_decay)
        return self.optimizer

    def register_comm_hook(self, hook):
        """Reduce the dp gradients through `hook` (parallel.data_parallel.comm_hooks), not a plain all-reduce."""
        self.replicas.register_comm_hook(hook)

    def configure_local_sgd(self, local_steps, outer_lr=None, outer_momentum=0.9):
        """Local SGD / DiLoCo over dp (parallel.data_parallel.local_sgd): no dp reduction per step; every
        `local_steps` optimizer steps the replicas average their pseudo-gradients."""
        self.replicas.configure_local_sgd(local_steps, outer_lr, outer_momentum)

    # --- training ------------------------------------------------------------------

    def local_batch(self, idx, targets):
        """This dp rank's rows (and cp rank's tokens) of the global batch, after checking every
        size on every rank."""
        idx, targets = np.asarray(idx), np.asarray(targets)
        if idx.ndim != 2 or targets.shape != idx.shape:
            raise ValueError(f"train_step needs idx and targets of the same shape (B, T), "
                             f"got {idx.shape} and {targets.shape}")
        (batch, seq), dp, m, tp = idx.shape, self.mesh.dp, self.microbatches, self.mesh.tp
        if batch % (dp * m):
            raise ValueError(f"global batch {batch} is not divisible by dp={dp} x microbatches={m} = {dp * m}")
        if seq > self.config.block_size:
            raise ValueError(f"sequence length {seq} exceeds block_size {self.config.block_size}")
        if self.context is not None:
            self.context.check_sequence_length(seq)
        local_seq = seq // self.mesh.cp
        if self.sequence_parallel and local_seq % tp:
            cp = f" / cp={self.mesh.cp} = {local_seq}" if self.mesh.cp > 1 else ""
            raise ValueError(f"sequence parallelism needs the sequence length {seq}{cp} divisible by tp={tp}")
        rows = slice(self.mesh.dp_rank * batch // dp, (self.mesh.dp_rank + 1) * batch // dp)
        if self.context is None:
            return idx[rows], targets[rows]
        return self.context.shard_sequence(idx[rows]), self.context.shard_sequence(targets[rows])

    def global_microbatches(self, idx, targets):
        """Micro-batch j over every dp rank: chunk j of each dp rank's rows (local_batch's rows,
        split in m as the pipeline splits them); a batch-scope balancing loss's token group."""
        idx, targets, dp, m = np.asarray(idx), np.asarray(targets), self.mesh.dp, self.microbatches
        rows = np.arange(len(idx)).reshape(dp, m, -1)
        return [(idx[rows[:, j].reshape(-1)], targets[rows[:, j].reshape(-1)]) for j in range(m)]

    def train_step(self, idx, targets):
        """Forward and backward of one global batch (B, T); its gradient ADDS to `.grad`.
        Returns the mean loss over the global batch, on every rank (every dp × cp rank
        holds as many tokens: the mean of their means is the mean over all tokens)."""
        if self.synced:
            raise RuntimeError("train_step after the gradients were synced: call optimizer_step() or "
                               "zero_grad() before accumulating more")
        idx, targets = self.local_batch(idx, targets)
        self.pipeline.loss_scale = self.amp.scaler.scale
        loss = self.pipeline.train_step(idx, targets, zero_grad=False)
        self.replicas.after_batch()
        self.accumulated += 1
        group = self.mesh.dp_cp_group
        return float(group.all_reduce(np.array([loss]))[0]) / group.size

    def finish_grad_sync(self):
        """The gradients of the accumulated batches reduced as the replica synchronisation does it
        (replicas.py): the tp partial sums, the tied copies, the mean over the batches, then over
        the replicas (left to the optimizer under ZeRO-1; under ZeRO-2/3 the sums and
        reduce-scatters ran after each batch). Idempotent; every rank must call it alike."""
        if self.synced or not self.accumulated:
            return
        self.replicas.finish(self.accumulated)
        self.synced = True

    def optimizer_step(self, after=None):
        """Finish the gradient sync, step the optimizer and the step_updates, zero the gradients. `after(update)`, if
        given, is called after each update that stepped: "inner" (AdamW's) and "outer" (DiLoCo's,
        on the steps it syncs); the training loop checks there that the numbers stayed finite."""
        if self.optimizer is None:
            raise RuntimeError("optimizer_step() before configure_optimizer()")
        self.finish_grad_sync()
        stepped = self.amp.step(self.optimizer)  # skipped on every rank if any rank's gradients overflowed
        for _, update in self.step_updates if stepped else ():
            update.after_step()
        if stepped and after is not None:
            after("inner")
        if self.replicas.after_step(stepped) and after is not None:  # local SGD's outer step moved the masters
            after("outer")
        self.zero_grad()

    def zero_grad(self):
        self.pipeline.zero_grad()
        self.amp.zero_grad()
        self.replicas.zero_grad()
        self.accumulated, self.synced = 0, False
