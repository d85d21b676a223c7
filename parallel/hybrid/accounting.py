"""What a HybridGPT layout costs on this rank: memory held, communication counted, events.

Measured, not modelled: bytes from the live arrays (each buffer once), calls and bytes from
every group's counters, the pipeline's and the dp buckets' timed events. The planner's
formulas are checked against these.
"""
from ..data_parallel.flat_units import held_bytes
from ..pipeline.timeline import Event


class LayoutAccounting:
    """Mixed into HybridGPT; reads its mesh, stages, pipeline, amp, optimizer, replicas,
    tied and parameters()."""

    def events(self):
        """The pipeline's actions of the last step and the gradient buckets' communication spans
        ("dp_bucket", numbered by bucket; a mixture of experts' "edp_bucket" too), on the
        pipeline's clock."""
        if not self.pipeline.events:
            return []
        t0, rank = self.pipeline.t0, self.pipeline.events[0].rank
        return self.pipeline.events + [
            Event(rank, f"{section.name}_bucket", index, 0, start - t0, end - t0)
            for section, reducer in zip(self.replicas.sections, self.replicas.reducers)
            for index, start, end in reducer.spans if end is not None]

    # --- what the layout costs -------------------------------------------------------

    def memory_bytes(self):
        """Bytes this rank holds now, measured from the live arrays (each buffer once; a ZeRO-3
        placeholder none): {"params", "grads", "optim", "gathered"}; "gathered" is the peak of
        ZeRO-3's all-gathered units since the last reset_memory_peak(). Under a mixed precision
        policy the float32 masters (whole, or ZeRO-2/3's chunks) count as optimizer state, as do
        the step_updates' arrays (a MoE layer's float32 routing bias), and
        their gradients as gradients. Between steps the first three are every array the model
        and its optimizer hold: the flat buffers of the gradient collectives are dropped after
        each (tests/parallel/hybrid/test_memory_held.py walks them all), and AdamW's flat
        gradient array counts also after zero_grad() dropped the .grad views into it."""
        params, held = self.parameters(), self.replicas.held_arrays()
        masters = self.amp.masters if self.amp.keeps_whole_masters else []
        # the flat gradient array AdamW lays out (minitensor.flat_params) stays when zero_grad drops .grad
        grads = [g for p in params + masters for g in (p.grad, p._grad_slot) if g is not None]
        return {"params": held_bytes([p.data for p in params] + held["params"]),
                "grads": held_bytes(grads + held["grads"]),
                "optim": (self.optimizer.state_bytes() if self.optimizer else 0)
                + held_bytes([m.data for m in masters] + held["optim"]
                             + [a for _, update in self.step_updates for a in update.arrays()]),
                "gathered": max([s.peak_gathered_bytes for s in self.replicas.shardings], default=0)}

    def reset_memory_peak(self):
        for sharding in self.replicas.shardings:
            sharding.reset_peak()

    def groups(self):
        """The mesh's groups by name; under cp > 1 also cp (the ring) and dp_cp (the gradients);
        with a tied embedding across pipeline ends, embedding (its two copies; DualPipe's every
        stage's: mirror); under ZeRO-3
        the copies of the replica group that the parameter gathers use; under ep > 1 ep (the
        all-to-alls) and edp (the experts' gradients)."""
        mesh = self.mesh
        cp = {"cp": mesh.cp_group, "dp_cp": mesh.dp_cp_group} if mesh.cp > 1 else {}
        tied = {self.tied.name: self.tied.group} if self.tied.group is not None else {}
        params = {f"{unit.bucket.section}-params.{i}": unit.group
                  for i, sharding in enumerate(self.replicas.shardings) for unit in sharding.units}
        experts = {"ep": mesh.ep_group, "edp": mesh.edp_group} if mesh.ep > 1 else {}
        return {"dp": mesh.dp_group, "tp": mesh.tp_group, "pp": mesh.pp_group, **cp, **tied, **params, **experts}

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
