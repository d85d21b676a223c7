"""--check: the single-device GPT (or BERT) trained on rank 0 beside the parallel one, step by step.

Rank 0 builds the dense float64 GPT from the same seed, trains it on the same global
batches with the same AdamW, and compares the loss and every gradient (gathered by
single-device name from all ranks) with the parallel model's. The relative difference
of a gradient is max|g - g_ref| / max|g_ref|; a gradient that is zero in exact arithmetic
(the attention key bias: softmax ignores a shift shared by all keys) is noise around 0,
so its difference is measured against 1e-6 of the largest gradient instead. One device runs
each global batch as the parallel model's micro-batch steps (global_microbatches: step j
takes chunk j of every dp rank's rows), each loss / m as the pipeline's: every loss is
a mean over equal shares of tokens, so only the batch-scope balancing loss, whose token group
is the micro-batch (minitensor.nn.moe), sees the split.

Under --precision fp16/bf16 the reference is one device under the SAME policy (16-bit
compute, float32 masters, the same loss scaler). They cannot agree bit for bit: the
layout changes where 16-bit rounding happens (a micro-batch's gradient is rounded to
16 bits before the micro-batches are added; a tensor-parallel layer's partial sums
are rounded before the all-reduce), so each differs by a few 16-bit roundings:
TOLERANCES is ~10 units of the format's ε (float16 2⁻¹⁰, bfloat16 2⁻⁷) in the worst
gradient, far below the difference between the policy and float64. The floor of a
gradient that is zero in exact arithmetic is then the format's ε times the largest
gradient (instead of 1e-6): below it, a 16-bit gradient is rounding noise.

Under an FP8 recipe (--precision fp8-current, fp8-delayed or fp8-blockwise, float64) the reference is one
device under the same recipe, and they agree to 1e-9: the amaxes are MAX-reduced (exact, in
any order), so every layout casts the same values with the same scales, and only the float64
sums around the FP8 products differ (a value within float64's rounding of an FP8 rounding
midpoint could still round the other way; at ~2⁻⁴⁹ per element, none was seen).
"""
import numpy as np

import minitensor as mt
from minitensor.amp import MixedPrecision
from minitensor.optim import AdamW

from .flag_checks import precision_of

# 16-bit: 10 ε of the format; FP8 recipes in float64: the same FP8 operands, exact float64 sums
TOLERANCES = {"fp64": 1e-9, "fp16": 1e-2, "bf16": 8e-2, "fp8-current": 1e-9, "fp8-delayed": 1e-9,
              "fp8-blockwise": 1e-9}
NOISE_FLOORS = {"fp64": 1e-6, "fp16": 2.0**-10, "bf16": 2.0**-7, "fp8-current": 1e-6, "fp8-delayed": 1e-6,
                "fp8-blockwise": 1e-6}


class SingleDeviceCheck:
    """Built on every rank (the gathers are collectives); only rank 0 holds the dense model."""

    def __init__(self, parallel_model, args, group):
        self.group, self.worst, self.model = group, 0.0, None
        if group.rank == 0:
            mt.manual_seed(args.seed)
            self.model = parallel_model.dense_class(parallel_model.config, dtype=np.dtype(args.dtype))
            self.amp = MixedPrecision(self.model.parameters(), precision_of(args), model=self.model)
            self.optimizer = AdamW(self.amp.masters, lr=args.lr, weight_decay=args.weight_decay,
                                   moment_dtype=self.amp.policy.moment_dtype)  # the same policy's moments
            self.updates = [update for module in self.model.modules() for update in module.step_updates()]
        self.tolerance, self.noise_floor = TOLERANCES[args.precision], NOISE_FLOORS[args.precision]

    def check_step(self, model, batches, loss, step, lr):
        """Gather the parallel gradients, run the same step on one device, compare.
        Returns rank 0's report line (None elsewhere); raises beyond the tolerance."""
        grads = model.full_grads()
        if self.model is None:
            return None
        steps = [model.global_microbatches(idx, targets) for idx, targets in batches]
        loss_diff, grad_diff, name = self.compare(steps, loss, grads)
        self.optimizer.defaults["lr"] = lr
        self.amp.step(self.optimizer)
        for update in self.updates:  # a MoE layer's loss-free balancing bias, from one device's loads
            update.after_step()
        if max(loss_diff, grad_diff) > self.tolerance:
            raise AssertionError(f"--check failed at step {step}: difference {max(loss_diff, grad_diff):.2e} "
                                 f"> {self.tolerance:g} ({name})")
        return (f"check step {step}: loss {loss:.10f}, relative loss difference {loss_diff:.1e}, largest relative "
                f"gradient difference {grad_diff:.1e} ({name}) vs one device")

    def compare(self, batches, loss, grads):
        """(relative loss difference, worst relative gradient difference, its name); `batches`: each
        global batch's micro-batches."""
        self.amp.zero_grad()
        ref_losses = []
        for micro in batches:  # as the parallel model: a batch's micro-batch losses / m (the pipeline's, so an
            for idx, targets in micro:  # FP8 gradient is cast at the batch's size), the batches added, divided after
                _, ref_loss = self.model(idx, targets)
                self.amp.backward(ref_loss / len(micro))
                ref_losses.append(ref_loss.item())
        self.amp.grads_to_master(divisor=len(batches))
        ref_loss = float(np.mean(ref_losses))
        scale = self.amp.scaler.scale
        ref_grads = {name: m.grad / scale if scale != 1 else m.grad
                     for (name, _), m in zip(self.model.named_parameters(), self.amp.masters)}
        if list(grads) != list(ref_grads):
            raise AssertionError(f"--check: gathered gradient names {list(grads)} differ from {list(ref_grads)}")
        floor = self.noise_floor * max(float(np.abs(g).max()) for g in ref_grads.values())
        diffs = {name: float(np.abs(grads[name] - ref).max()) / max(float(np.abs(ref).max()), floor)
                 for name, ref in ref_grads.items()}
        name = max(diffs, key=diffs.get)
        loss_diff = abs(loss - ref_loss) / abs(ref_loss)
        self.worst = max(self.worst, diffs[name], loss_diff)
        return loss_diff, diffs[name], name
