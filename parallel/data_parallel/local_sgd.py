"""Local SGD / DiLoCo: replicas train alone for H steps, then average how far they moved.

    every replica, from the shared anchor θ:   H inner steps (AdamW) on its own data ─▶ θ_i
    pseudo-gradient   Δ_i = θ − θ_i            (before − after: it points uphill, like a gradient)
    all-reduce        Δ = mean_i Δ_i            (one reduction of all parameters per H steps)
    outer step        v ← μ·v + Δ;  θ ← θ − lr_out·(Δ + μ·v)   (SGD with Nesterov momentum)
    every replica restarts from the new θ

Communication falls by H: one all-reduce of the parameters per H optimizer steps instead
of one of the gradients per step (Lin et al. 2018, "Don't use large mini-batches, use local
SGD"; Douillard et al. 2023, DiLoCo: AdamW inside, Nesterov outside). With H = 1, lr_out = 1
and μ = 0 the outer step lands on θ − mean_i(θ − θ_i) = mean_i θ_i, the mean of the inner
results; with an inner SGD step θ_i = θ − lr·g_i that is θ − lr·mean_i g_i, exactly
synchronous data parallelism. (Δ = θ_i − θ instead, a sign slip real code has shipped,
walks the other way.)

The outer learning rate defaults to 1 − μ. While the Δ keep one direction (they do when H
is small: AdamW's own momentum carries from one period to the next), v tends to Δ/(1 − μ)
and the outer step to lr_out·Δ/(1 − μ): lr_out = 1 − μ moves the anchor as far as the mean
replica moved, at the stride the inner learning rate was tuned for. DiLoCo's published
(0.7, 0.9), tuned with a small inner learning rate and H = 500, is a 7× stride: at this
project's learning rate and H = 4 the addition task stalled at 5% (chapter 13).

The mean goes through the gradient `Reducer` of the data-parallel group: Δ is written into
`.grad`, reduced bucket by bucket, and read back; `.grad` is cleared afterwards.
"""
import numpy as np


class DiLoCo:
    """Outer optimizer over `reducer`'s parameters and group, synced every `local_steps` inner steps."""

    def __init__(self, reducer, local_steps, outer_lr=None, outer_momentum=0.9, nesterov=True):
        if not isinstance(local_steps, int) or local_steps < 1:
            raise ValueError(f"DiLoCo: local_steps={local_steps!r} must be an int ≥ 1")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"DiLoCo: outer_momentum={outer_momentum!r} must be in [0, 1)")
        outer_lr = 1 - outer_momentum if outer_lr is None else outer_lr  # a stride of 1 (docstring)
        if not outer_lr > 0:
            raise ValueError(f"DiLoCo: outer_lr={outer_lr!r} must be > 0")
        self.reducer, self.local_steps = reducer, local_steps
        self.outer_lr, self.outer_momentum, self.nesterov = outer_lr, outer_momentum, nesterov
        self.params = [p for bucket in reducer.buckets for p in bucket.params]
        self.anchors = [p.data.copy() for p in self.params]  # θ, where the replicas last agreed
        self.velocity = [np.zeros_like(p.data) for p in self.params]
        self.inner_steps = 0  # since the last sync

    def step(self):
        """Count one inner optimizer step; every `local_steps`-th, sync. Returns whether it synced."""
        self.inner_steps += 1
        if self.inner_steps < self.local_steps:
            return False
        self.sync()
        return True

    def sync(self):
        """Average the pseudo-gradients over the group and take the outer step (a collective)."""
        for p, anchor in zip(self.params, self.anchors):
            p.grad = anchor - p.data  # Δ_i = before − after
        self.reducer.finish()  # .grad = mean_i Δ_i
        for p, anchor, velocity in zip(self.params, self.anchors, self.velocity):
            # exercise 13.1: the outer Nesterov step
            # hint: v ← μ·v + Δ; step = Δ + μ·v with Nesterov (else v); θ ← anchor − lr_out·step, in place,
            # hint: and the anchor becomes the new θ.
            velocity *= self.outer_momentum
            velocity += p.grad
            update = p.grad + self.outer_momentum * velocity if self.nesterov else velocity
            p.data[...] = anchor - self.outer_lr * update
            anchor[...] = p.data
            # end exercise
            p.grad = None
        self.inner_steps = 0

    def restart(self):
        """Start an outer period from the parameters as they are (after loading a plain
        checkpoint): they become the anchor, with no momentum and no inner steps yet."""
        for p, anchor, velocity in zip(self.params, self.anchors, self.velocity):
            anchor[...] = p.data
            velocity[...] = 0
        self.inner_steps = 0

    def hyperparameters(self):
        return {"local_steps": self.local_steps, "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
                "nesterov": self.nesterov}

    def state_dict(self):
        """This rank's state, as arrays: the anchor and Nesterov buffer per parameter (alike
        on every replica) and the inner steps since the last sync. A checkpoint adds the
        replica's own parameters and AdamW moments (parallel.checkpoint), so a run can stop
        and resume between outer steps."""
        return {"inner_steps": np.array(self.inner_steps),
                **{f"anchor.{i}": a.copy() for i, a in enumerate(self.anchors)},
                **{f"velocity.{i}": v.copy() for i, v in enumerate(self.velocity)}}

    def load_state_dict(self, state):
        self.inner_steps = int(state["inner_steps"])
        for i, (anchor, velocity) in enumerate(zip(self.anchors, self.velocity)):
            anchor[...] = state[f"anchor.{i}"]
            velocity[...] = state[f"velocity.{i}"]
