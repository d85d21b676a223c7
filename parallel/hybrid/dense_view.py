"""HybridGPT's single-device view: every rank's shards merged under the dense model's names.

Collectives over the whole mesh: tp gathers a stage's shards (the stages' own
full_state_dict / full_grads), pp merges the stages, and under ZeRO the dp chunks are
gathered first. The checks compare these with one device name by name; checkpoints save
and load through them.
"""
from ..comm.gather import gather_named_arrays
from ..data_parallel.flat_units import gather_grad_shards
from .experts import join_experts, mean_over_replicas


class DenseView:
    """Mixed into HybridGPT; reads its stages, dense_names, mesh, amp, zero, dp_reducer,
    parameters(), full_parameters() and finish_grad_sync()."""

    def _merge(self, local):
        """Each stage's tp-gathered arrays merged over ep (each rank's experts) and pp, in
        single-device name order (a tied copy on the last stage is left out: the first stage's
        is the same)."""
        copies = {name for stage in self.stages if not stage.is_first for name in stage.tied_names()}
        local = join_experts({n: a for n, a in local.items() if n not in copies}, self.mesh)
        merged = gather_named_arrays(self.mesh.pp_group, local)
        return {name: merged[name] for name in self.dense_names if name in merged}

    def full_state_dict(self):
        """Single-device-named parameters (the masters under a mixed policy)."""
        local = {}
        with self.full_parameters(), self.amp.params_hold_masters():
            for stage in self.stages:
                local.update(stage.full_state_dict())
        return self._merge(local)

    def full_grads(self):
        """Single-device-named gradients of the synced step (finishes the sync first), unscaled,
        in the master dtype; under ZeRO-1 the dp × cp mean is taken here, since the raw gradients
        are still local; under ZeRO-2/3 every rank's chunk is gathered."""
        self.finish_grad_sync()
        params = self.parameters()
        if self.zero > 1:  # the averaged gradients, whole, only for this call
            grads = gather_grad_shards(self.dp_reducer.buckets, self.mesh.dp_cp_group)
            for p in params:
                p.grad = grads.get(id(p))
        local = {}
        with self.full_parameters(), self.amp.params_hold_masters():
            for stage in self.stages:
                local.update(stage.full_grads())
        if self.zero > 1:
            for p in params:
                p.grad = None
        local = {name: g / self.amp.scaler.scale for name, g in local.items()} if self.amp.scaler.enabled else local
        if self.zero == 1:  # the dp × cp mean (experts: the edp sum / dp), as the optimizer takes it
            local = {name: mean_over_replicas(name, g, self.mesh) for name, g in local.items()}
        return self._merge(local)

    def load_full_state_dict(self, state):
        """Load single-device-named parameters: each rank keeps its stages' shards."""
        missing = [name for name in self.dense_names if name not in state]
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing}")
        with self.full_parameters(writeback=True), self.amp.params_hold_masters():
            for stage in self.stages:
                names = [name for name, _ in stage.named_parameters()]
                stage.load_full_state_dict({name: state[name] for name in names})
