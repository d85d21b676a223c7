"""The run never goes on from, or saves, numbers that are not finite.

Two checks, each agreed by every rank through one MAX all-reduce of its flags (so no rank
is left waiting in the next collective when another stops):

    before the optimizer step   the loss and every synced gradient      (check_finite)
    after each update           the parameters and the optimizer state  (check_state_finite)
                                (AdamW's step, and DiLoCo's outer step on the steps it syncs)

A finite loss and gradient can still give inf weights: an update of lr·m/(√v + ε) with
--lr 1e30 overflows float32, and so does an outer step of --outer-lr 1e38. The second
check runs before any save, so a checkpoint (and `latest`) only ever holds finite numbers.
"""
import math

import numpy as np

NOTHING_SAVED = "no checkpoint of this run was saved before it"  # the messages' last good checkpoint, before one


class TrainingStopped(RuntimeError):
    """The run cannot go on (a loss, gradient, weight or moment is not finite); raised on every rank alike."""


def agreed(flags, group):
    """Every rank's flags OR-ed over the group (a MAX all-reduce)."""
    return group.all_reduce(np.array(flags, dtype=np.int64), op="max")


def check_finite(model, loss, step, losses, group, last_good):
    """Stop at `step`, on every rank, if the loss or any rank's synced gradient is not finite.
    Checked before the optimizer step, so the weights stay those of the last finite step.
    Under loss scaling (fp16) an inf/nan gradient is no error: the scaler skips that step and
    lowers the scale."""
    grads_finite = model.amp.scaler.enabled or all(np.isfinite(p.grad).all() for _, p in model.named_master_parameters()
                                                   if p.grad is not None)
    bad_loss, bad_grad = agreed([not math.isfinite(loss), not grads_finite], group)
    if bad_loss or bad_grad:
        what = (f"the loss is not finite ({loss})" if bad_loss else
                "the gradient norm is not finite (a gradient holds inf or nan)")
        last = (f"the last finite loss was {losses[-1]:.6g} at step {step - 1}" if losses else
                "no step of this run finished before it")
        raise TrainingStopped(f"step {step}: {what}; stopped before its optimizer step ({last}; {last_good}); "
                              f"{hint(model, step)}")


def hint(model, step):
    """What to change: the weights this step ran on came from the last update, DiLoCo's outer
    step if the period had just ended (no inner step since), else AdamW's."""
    if model.outer is not None and model.outer.inner_steps == 0 and step > 1:
        return "the weights came from DiLoCo's outer step just before: try a smaller --outer-lr"
    return "try a smaller --lr or a longer --warmup"


def state_arrays(model, update):
    """The arrays `update` ("inner": AdamW's step, "outer": DiLoCo's) wrote: the parameters the
    optimizer steps and the optimizer's state, or the outer optimizer's anchor and momentum."""
    if update == "outer":
        return [*model.outer.anchors, *model.outer.velocity]
    return model.optimizer.stepped_arrays()  # the arrays themselves: no copy per step


BLAME = {"inner": "the optimizer step made a weight or an AdamW moment inf or nan; try a smaller --lr",
         "outer": "DiLoCo's outer step made a weight or its momentum inf or nan; try a smaller --outer-lr"}


def check_state_finite(model, update, step, group, last_good):
    """Stop at `step`, on every rank, if `update` left a parameter or optimizer state not finite."""
    finite = all(np.isfinite(a).all() for a in state_arrays(model, update) if a.dtype.kind == "f")
    (bad,) = agreed([not finite], group)
    if bad:
        raise TrainingStopped(f"step {step}: {BLAME[update]} (nothing of step {step} was saved; {last_good})")
