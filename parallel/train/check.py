"""--check: the single-device GPT (or BERT) trained on rank 0 beside the parallel one, step by step.

Rank 0 builds the dense float64 GPT from the same seed, trains it on the same global
batches with the same AdamW, and compares the loss and every gradient (gathered by
single-device name from all ranks) with the parallel model's. The relative difference
of a gradient is max|g - g_ref| / max|g_ref|; a gradient that is zero in exact arithmetic
(the attention key bias: softmax ignores a shift shared by all keys) is noise around 0,
so its difference is measured against 1e-6 of the largest gradient instead.
"""
import numpy as np

import minitensor as mt
from minitensor.optim import AdamW

TOLERANCE = 1e-9  # float64


class SingleDeviceCheck:
    """Built on every rank (the gathers are collectives); only rank 0 holds the dense model."""

    def __init__(self, parallel_model, args, group):
        self.group, self.worst, self.model = group, 0.0, None
        if group.rank == 0:
            mt.manual_seed(args.seed)
            self.model = parallel_model.dense_class(parallel_model.config, dtype=np.dtype(args.dtype))
            self.optimizer = AdamW(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def check_step(self, model, batches, loss, step, lr):
        """Gather the parallel gradients, run the same step on one device, compare.
        Returns rank 0's report line (None elsewhere); raises beyond the tolerance."""
        grads = model.full_grads()
        if self.model is None:
            return None
        loss_diff, grad_diff, name = self.compare(batches, loss, grads)
        self.optimizer.defaults["lr"] = lr
        self.optimizer.step()
        if max(loss_diff, grad_diff) > TOLERANCE:
            raise AssertionError(f"--check failed at step {step}: difference {max(loss_diff, grad_diff):.2e} "
                                 f"> {TOLERANCE:g} ({name})")
        return (f"check step {step}: loss {loss:.10f}, relative loss difference {loss_diff:.1e}, largest relative "
                f"gradient difference {grad_diff:.1e} ({name}) vs one device")

    def compare(self, batches, loss, grads):
        """(relative loss difference, worst relative gradient difference, its name)."""
        self.optimizer.zero_grad()
        ref_losses = []
        for idx, targets in batches:
            _, ref_loss = self.model(idx, targets)
            (ref_loss / len(batches)).backward()
            ref_losses.append(ref_loss.item())
        ref_loss = float(np.mean(ref_losses))
        ref_grads = {name: p.grad for name, p in self.model.named_parameters()}
        if list(grads) != list(ref_grads):
            raise AssertionError(f"--check: gathered gradient names {list(grads)} differ from {list(ref_grads)}")
        floor = 1e-6 * max(float(np.abs(g).max()) for g in ref_grads.values())
        diffs = {name: float(np.abs(grads[name] - ref).max()) / max(float(np.abs(ref).max()), floor)
                 for name, ref in ref_grads.items()}
        name = max(diffs, key=diffs.get)
        loss_diff = abs(loss - ref_loss) / abs(ref_loss)
        self.worst = max(self.worst, diffs[name], loss_diff)
        return loss_diff, diffs[name], name
