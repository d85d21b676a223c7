"""Gradient utilities."""
import numpy as np


def clip_grad_norm_(parameters, max_norm):
    """Scale all gradients in place so their global L2 norm is at most `max_norm`.

    Returns the norm before clipping, like `torch.nn.utils.clip_grad_norm_`.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    total = float(np.sqrt(sum(float(np.vdot(g, g)) for g in grads)))
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        for g in grads:
            g *= scale
    return total
