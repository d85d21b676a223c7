"""`gradcheck`: compare every backward with central differences, in float64.

For a function f with output y and a fixed random upstream gradient u, backward
computes ∂(u·y)/∂x for each input x. Central differences estimate the same number one
element at a time:  ∂(u·y)/∂xᵢ ≈ (u·f(x + εeᵢ) − u·f(x − εeᵢ)) / 2ε, with error O(ε²).
A random u (not all ones) makes every output element count with a different weight, so
a backward that mixes up output positions cannot pass by symmetry.
"""
import numpy as np

from minitensor.autograd import no_grad


def _weighted_output(fn, inputs, upstream):
    with no_grad():
        return float(np.vdot(upstream, fn(*inputs).data))


def _numeric_grad(fn, inputs, upstream, tensor, eps):
    """∂(u·f)/∂x for one input x, by perturbing its elements in place one at a time."""
    numeric = np.zeros(tensor.shape)
    for index in np.ndindex(tensor.shape):
        original = tensor.data[index]
        tensor.data[index] = original + eps
        plus = _weighted_output(fn, inputs, upstream)
        tensor.data[index] = original - eps
        minus = _weighted_output(fn, inputs, upstream)
        tensor.data[index] = original
        numeric[index] = (plus - minus) / (2 * eps)
    return numeric


def _analytic_grads(fn, inputs, upstream, checked):
    saved = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    if not out.requires_grad:
        raise ValueError("gradcheck: the function's output does not require grad (no graph to check)")
    out.backward(upstream)
    grads = [np.zeros(inputs[i].shape) if inputs[i].grad is None else inputs[i].grad for i in checked]
    for t, g in zip(inputs, saved):
        t.grad = g
    return grads


def gradcheck(fn, *inputs, eps=1e-6, atol=1e-5, rtol=1e-4, seed=0):
    """Check `fn(*inputs).backward` against central differences for every input that
    requires grad. Inputs must be float64 tensors; `fn` must be deterministic. `seed`
    draws the random upstream gradient (standard normal, the shape of the output).

    Passes when |analytic − numeric| ≤ atol + rtol·|numeric| for every element; otherwise
    raises AssertionError naming the worst element. Returns True on success.
    """
    checked = [i for i, t in enumerate(inputs) if t.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise TypeError(f"gradcheck: input {i} has dtype {inputs[i].dtype}; central differences need float64")
    with no_grad():
        out_shape = fn(*inputs).shape
    upstream = np.random.default_rng(seed).standard_normal(out_shape)
    analytic = _analytic_grads(fn, inputs, upstream, checked)
    worst = None
    for i, grad in zip(checked, analytic):
        numeric = _numeric_grad(fn, inputs, upstream, inputs[i], eps)
        error = np.abs(grad - numeric)
        excess = error / (atol + rtol * np.abs(numeric))
        j = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else None
        if j is not None and (worst is None or excess[j] > worst[0]):
            worst = (excess[j], i, j, grad[j], numeric[j], error[j])
    if worst is not None and worst[0] > 1:
        _, i, j, a, n, e = worst
        raise AssertionError(
            f"gradcheck failed: input {i}, element {tuple(int(k) for k in j)}: analytic {a:.10g}, "
            f"numeric {n:.10g}, error {e:.3g} > atol {atol:g} + rtol {rtol:g}·|numeric|"
        )
    return True
