"""A mixture-of-experts GPT over data × expert parallelism: `Mesh(dp, ep=ep)`, ep dividing dp.

    global batch (B, T) ──split over dp──▶ this rank's rows (B/dp, T), in m micro-batches
        ──every MoE block──▶ tokens to their experts' ranks and back over the ep group
                             (expert_parallel.dispatch: two all-to-alls each way)
        ──gradients──▶ dense parameters (attention, norms, embeddings, routers): the mean
                       over dp, as data parallelism always does
                       experts: summed over the edp group (the ranks holding the same
                       experts), divided by dp: each rank's expert gradient already sums
                       what its ep group's tokens sent it, so the edp sum is the sum over
                       all dp ranks' losses, and /dp makes it the gradient of their mean
        ──optimizer──▶ AdamW on this rank's parameters

Both reductions go through the one gradient Reducer (data_parallel.reducer). Every MoE
layer's capacity and balancing loss are per sequence (minitensor.nn.moe), so the loss
and every gradient equal one device's on the same global batch. Not composed yet: tp,
pp, cp, ZeRO, 16-bit precision, checkpoints (parallel.train refuses them with --experts).
"""
import numpy as np

from minitensor.amp import MixedPrecision, policy_of_dtype
from minitensor.nn.moe import MoE
from minitensor.optim import AdamW

from ..comm.gather import gather_named_arrays
from ..data_parallel.ddp import broadcast_parameters
from ..data_parallel.reducer import Reducer
from ..expert_parallel import shard_experts
from .parallel_model import ParallelModel


def is_expert(name):
    return ".experts." in name


class ExpertParallelGPT(ParallelModel):
    """This rank's part of the MoE `gpt` (every rank passes the same one) under `mesh`
    (tp = pp = cp = 1); microbatches: m per global batch and dp rank."""

    def __init__(self, gpt, mesh, microbatches=1):
        config = gpt.config
        if (mesh.tp, mesh.pp, mesh.cp) != (1, 1, 1):
            raise ValueError(f"ExpertParallelGPT runs over dp × ep; got tp={mesh.tp}, pp={mesh.pp}, cp={mesh.cp}")
        if config.n_experts % mesh.ep:
            raise ValueError(f"n_experts={config.n_experts} is not divisible by ep={mesh.ep}")
        self.config, self.mesh, self.dense_class, self.microbatches = config, mesh, type(gpt), microbatches
        self.dense_names = [name for name, _ in gpt.named_parameters()]
        self.model = shard_experts(gpt, mesh.ep_group) if mesh.ep > 1 else gpt
        named = self.named_parameters()
        dense = [p for name, p in named if not is_expert(name)]
        experts = [p for name, p in named if is_expert(name)]
        broadcast_parameters(dense, mesh.dp_group)  # the replicas start as one model
        broadcast_parameters(experts, mesh.edp_group)
        self.amp = MixedPrecision(self.parameters(), policy_of_dtype(dense[0].dtype), groups=(mesh.dp_group,))
        self.reducers = [Reducer(dense[::-1], mesh.dp_group), Reducer(experts[::-1], mesh.edp_group, divisor=mesh.dp)]
        self.optimizer = self.outer = self.comm_hook = None
        self.accumulated, self.synced = 0, False

    def moe_layers(self):
        return [block.mlp for block in self.model.blocks if isinstance(block.mlp, MoE)]

    def layout(self):
        return {"dp": self.mesh.dp, "tp": 1, "pp": 1, "ep": self.mesh.ep, "microbatches": self.microbatches,
                "zero": 0, "precision": self.amp.policy.name}

    def named_parameters(self):
        return list(self.model.named_parameters())

    def named_modules(self):
        return list(self.model.named_modules())

    def configure_optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.optimizer = AdamW(self.amp.masters, lr, betas, eps, weight_decay)
        return self.optimizer

    # --- training ------------------------------------------------------------------

    def train_step(self, idx, targets):
        """Forward and backward of one global batch (B, T) over this rank's rows, in m
        micro-batches; the gradient ADDS to `.grad`. Returns the mean loss of the global batch."""
        if self.synced:
            raise RuntimeError("train_step after the gradients were synced: call optimizer_step() or zero_grad()")
        idx, targets = np.asarray(idx), np.asarray(targets)
        batch, dp, m = idx.shape[0], self.mesh.dp, self.microbatches
        if idx.ndim != 2 or targets.shape != idx.shape or batch % (dp * m):
            raise ValueError(f"train_step needs idx and targets of one shape (B, T) with B divisible by dp={dp} x "
                             f"microbatches={m}; got {idx.shape} and {targets.shape}")
        rows = batch // dp
        mine = slice(self.mesh.dp_rank * rows, (self.mesh.dp_rank + 1) * rows)
        loss = 0.0
        for x, y in zip(np.split(idx[mine], m), np.split(targets[mine], m)):
            _, micro_loss = self.model(x, y)
            (micro_loss / m).backward()
            loss += micro_loss.item() / m
        self.accumulated += 1
        return float(self.mesh.dp_group.all_reduce(np.array([loss]))[0]) / dp

    def finish_grad_sync(self):
        """The mean over the accumulated batches, then the dp mean of the dense parameters and the
        edp sum / dp of the experts. Idempotent."""
        if self.synced or not self.accumulated:
            return
        self.amp.grads_to_master(divisor=self.accumulated)
        for reducer in self.reducers:
            reducer.finish()
        self.synced = True

    def optimizer_step(self, after=None):
        if self.optimizer is None:
            raise RuntimeError("optimizer_step() before configure_optimizer()")
        self.finish_grad_sync()
        if self.amp.step(self.optimizer) and after is not None:
            after("inner")
        self.zero_grad()

    def zero_grad(self):
        self.model.zero_grad()
        self.amp.zero_grad()
        self.accumulated, self.synced = 0, False

    # --- the single-device view ----------------------------------------------------

    def _gather(self, arrays):
        """{name: array} of this rank merged over the ep group (each expert from its rank, the
        rest from ep rank 0), in single-device order."""
        if self.mesh.ep > 1:
            keep = {name: a for name, a in arrays.items() if is_expert(name) or self.mesh.ep_rank == 0}
            arrays = gather_named_arrays(self.mesh.ep_group, keep)
        return {name: arrays[name] for name in self.dense_names}

    def full_state_dict(self):
        return self._gather({name: p.data for name, p in self.named_parameters()})

    def full_grads(self):
        self.finish_grad_sync()
        return self._gather({name: p.grad if p.grad is not None else np.zeros_like(p.data)
                             for name, p in self.named_parameters()})

    def load_full_state_dict(self, state):
        missing = [name for name in self.dense_names if name not in state]
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing}")
        for name, p in self.named_parameters():
            p.data[...] = state[name]

    def events(self):
        return []

    def groups(self):
        """dp (dense gradients, the loss), and under ep > 1 ep (the all-to-alls) and edp (expert gradients)."""
        mesh = self.mesh
        return {"dp": mesh.dp_group, **({"ep": mesh.ep_group, "edp": mesh.edp_group} if mesh.ep > 1 else {})}

    def communication_stats(self):
        return {(name, kind): counts for name, group in self.groups().items() if group.size > 1
                for kind, counts in group.stats().items()}

    def reset_communication_stats(self):
        for group in self.groups().values():
            group.reset_stats()
