"""HybridGPT's single-device view: every rank's shards merged under the dense model's names.

Collectives over the whole mesh: tp gathers a stage's shards (the stages' own
full_state_dict / full_grads), pp merges the stages, and under ZeRO the dp chunks are
gathered first. The checks compare these with one device name by name; checkpoints save
and load through them.
"""
from ..comm.gather import gather_named_arrays
from .sections import is_expert


def join_experts(local, mesh):
    """{name: array} of this rank with every ep rank's experts joined in (the rest: ep rank 0's)."""
    if mesh.ep == 1:
        return local
    return gather_named_arrays(mesh.ep_group, {name: a for name, a in local.items()
                                               if is_expert(name) or mesh.ep_rank == 0})


class DenseView:
    """Mixed into HybridGPT; reads its stages, dense_names, mesh, amp, replicas,
    full_parameters() and finish_grad_sync()."""

    def _merge(self, local):
        """Each stage's tp-gathered arrays merged over ep (each rank's experts) and pp, in
        single-device name order (a tied copy on the last stage, or DualPipe's mirrored copies, are
        left out: the other copy is the same)."""
        local = join_experts({n: a for n, a in local.items() if n not in self.tied.left_out}, self.mesh)
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
        in the master dtype, reduced over the replicas: ZeRO-1's raw local gradients here (as
        its optimizer takes them), ZeRO-2/3's chunks gathered whole for the call."""
        self.finish_grad_sync()
        local = {}
        with self.replicas.whole_grads(), self.full_parameters(), self.amp.params_hold_masters():
            for stage in self.stages:
                local.update(stage.full_grads())
        scale = self.amp.scaler.scale if self.amp.scaler.enabled else 1
        return self._merge({name: self.replicas.reduce_local(name, g) / scale for name, g in local.items()})

    def load_full_state_dict(self, state):
        """Load single-device-named parameters: each rank keeps its stages' shards."""
        missing = [name for name in self.dense_names if name not in state]
        if missing:
            raise KeyError(f"load_full_state_dict: missing keys {missing}")
        with self.full_parameters(writeback=True), self.amp.params_hold_masters():
            for stage in self.stages:
                names = [name for name, _ in stage.named_parameters()]
                stage.load_full_state_dict({name: state[name] for name in names})
