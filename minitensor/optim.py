"""Optimizers. The update rules are plain functions on numpy arrays, updated in place,
so a sharded optimizer (ZeRO) applies exactly the same arithmetic to its shard, and
AdamW and SGD apply it to all their parameters of a dtype at once through flat buffers
(minitensor.flat_params; switch: speed.disabled("flat_optimizer")).

AdamW's moments may be stored narrower than the parameters (`moment_dtype`, DeepSeek-V3
§3.3.1: bfloat16 moments beside float32 masters; Megatron-LM's --exp-avg-dtype and
--exp-avg-sq-dtype bf16): 4 bytes per parameter instead of 8 (minitensor.narrow_moments)."""
import math

import numpy as np

from minitensor import speed
from minitensor.flat_params import FlatLayout
from minitensor.narrow_moments import moment_dtype_of, widened


def sgd_update(param, grad, momentum_buffer, lr, momentum, weight_decay):
    """p ← p − lr·v with v ← μ·v + (g + λ·p) (PyTorch's SGD, dampening 0)."""
    if weight_decay:
        grad = grad + weight_decay * param
    if momentum_buffer is not None:
        momentum_buffer *= momentum
        momentum_buffer += grad
        grad = momentum_buffer
    param -= lr * grad


def adamw_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """One AdamW step (Loshchilov & Hutter, Alg. 2), bias-corrected, decay decoupled.

    p ← p·(1 − lr·λ) − lr·m̂/(√v̂ + ε), m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ).
    Every line works in place; `scratch` is the one temporary the size of `param`.
    Moments stored narrower than `param` (bfloat16) are read widened and stored back rounded
    (minitensor.narrow_moments: this step's update reads the unrounded values).
    """
    if exp_avg.dtype != param.dtype:
        with widened(param.dtype, exp_avg, exp_avg_sq) as (m, v):
            adamw_update(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay)
        return
    scratch = np.multiply(grad, 1 - beta1, dtype=param.dtype)
    param *= 1 - lr * weight_decay
    exp_avg *= beta1
    exp_avg += scratch
    np.multiply(grad, grad, out=scratch)
    scratch *= 1 - beta2
    exp_avg_sq *= beta2
    exp_avg_sq += scratch
    denom = np.sqrt(exp_avg_sq, out=scratch)  # √v̂ + ε = √v / √(1 − β₂ᵗ) + ε
    denom *= 1 / math.sqrt(1 - beta2**step)
    denom += eps
    np.divide(exp_avg, denom, out=denom)
    denom *= lr / (1 - beta1**step)
    param -= denom


class Optimizer:
    """Holds the parameter list and per-parameter state (keyed by position)."""

    def __init__(self, params, defaults):
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        self.defaults = dict(defaults)
        self.state = {}
        self._flat = {}  # dtype -> FlatLayout of the trainable parameters of that dtype

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def trainable(self):
        """(index, parameter) for every parameter that has a gradient this step."""
        return [(i, p) for i, p in enumerate(self.params) if p.requires_grad and p.grad is not None]

    def flat_and_rest(self, new_state, state_keys, state_dtype=None):
        """This step's parameters as ([(states, FlatLayout)], [(index, parameter)]): one flat
        layout per dtype whose trainable parameters all have a gradient and equal step
        counts (their states made with `new_state()` where missing, in `state_dtype(parameter)`,
        default the parameter's dtype), the rest (and all, with the switch off) for the
        per-tensor loop. A layout is (re)made when it is stale."""
        trainable = self.trainable()
        if not speed.enabled("flat_optimizer"):
            for layout in self._flat.values():
                layout.release()
            self._flat = {}
            return [], trainable
        by_dtype, with_grad = {}, {i for i, _ in trainable}
        for i, p in enumerate(self.params):
            if p.requires_grad:
                by_dtype.setdefault(p.dtype, []).append(i)
        flat, rest = [], []
        for dtype, indices in by_dtype.items():
            states = [self.state.get(i) or new_state() for i in indices]
            counters = {tuple((k, v) for k, v in s.items() if not isinstance(v, np.ndarray)) for s in states}
            if not with_grad.issuperset(indices) or len(counters) > 1:
                rest += [(i, self.params[i]) for i in indices if i in with_grad]
                continue
            params, layout = [self.params[i] for i in indices], self._flat.get(dtype)
            if not (layout and layout.intact(params, states, state_keys)):
                if layout:
                    layout.release()
                layout = self._flat[dtype] = FlatLayout(params, states, state_keys,
                                                        state_dtype(params[0]) if state_dtype else None)
            self.state.update((i, s) for i, s in zip(indices, states) if s)  # SGD without momentum keeps none
            layout.gather_grads()
            flat.append((states, layout))
        return flat, rest

    def state_arrays(self):
        """The arrays of the optimizer's state, themselves (no copies): the moments, the momentum."""
        return [v for s in self.state.values() for v in s.values() if isinstance(v, np.ndarray)]

    def stepped_arrays(self):
        """The arrays step() writes, themselves: the parameters' values and the state."""
        return [p.data for p in self.params] + self.state_arrays()

    def state_dict(self):
        return {
            "defaults": dict(self.defaults),
            "state": {i: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                      for i, s in self.state.items()},
        }

    def load_state_dict(self, state_dict):
        for i, s in state_dict["state"].items():
            i = int(i)
            if i >= len(self.params):
                raise ValueError(f"optimizer state for parameter {i}, but only {len(self.params)} parameters")
            for k, v in s.items():
                if isinstance(v, np.ndarray) and v.shape != self.params[i].shape:
                    raise ValueError(f"optimizer state '{k}' of parameter {i} has shape {v.shape}, "
                                     f"parameter has {self.params[i].shape}")
        self.defaults.update(state_dict["defaults"])
        self.state = {int(i): {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                      for i, s in state_dict["state"].items()}


class SGD(Optimizer):
    def __init__(self, params, lr=1e-2, momentum=0.0, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    def step(self):
        d = self.defaults
        keys = ("momentum_buffer",) if d["momentum"] else ()
        flat, rest = self.flat_and_rest(dict, keys)
        for _, layout in flat:
            layout.apply(lambda p, g, buf=None: sgd_update(p, g, buf, d["lr"], d["momentum"], d["weight_decay"]))
        for i, p in rest:
            buf = None
            if d["momentum"]:
                buf = self.state.setdefault(i, {}).get("momentum_buffer")
                if buf is None:  # zeros: the first update leaves v = g, as PyTorch does
                    buf = self.state[i]["momentum_buffer"] = np.zeros_like(p.data)
            sgd_update(p.data, p.grad, buf, d["lr"], d["momentum"], d["weight_decay"])


class AdamW(Optimizer):
    """AdamW; `moment_dtype`: None (the parameters' dtype: float32, float64 for the tests'
    reference) or a narrower one of MOMENT_DTYPES ("bfloat16"), the dtype exp_avg and exp_avg_sq
    are kept in (minitensor.narrow_moments). The setting stays the optimizer's own: a loaded state
    is converted to it (widening is exact; narrowing rounds to nearest even, as a step's store)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, moment_dtype=None):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.moment_dtype = moment_dtype
        for p in self.params:
            moment_dtype_of(moment_dtype, p.dtype)  # refused here, before any step

    def moments_dtype(self, param):
        return moment_dtype_of(self.moment_dtype, param.dtype)

    def step(self):
        d = self.defaults
        flat, rest = self.flat_and_rest(lambda: {"step": 0}, ("exp_avg", "exp_avg_sq"), self.moments_dtype)
        for states, layout in flat:
            step = states[0]["step"] + 1
            for s in states:
                s["step"] = step
            layout.apply(lambda p, g, m, v: adamw_update(p, g, m, v, step, d["lr"], *d["betas"], d["eps"],
                                                         d["weight_decay"]))
        for i, p in rest:
            s = self.state.setdefault(i, {"step": 0, "exp_avg": np.zeros(p.shape, self.moments_dtype(p)),
                                          "exp_avg_sq": np.zeros(p.shape, self.moments_dtype(p))})
            s["step"] += 1
            adamw_update(p.data, p.grad, s["exp_avg"], s["exp_avg_sq"], s["step"], d["lr"], *d["betas"],
                         d["eps"], d["weight_decay"])

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for i, s in self.state.items():
            for key in ("exp_avg", "exp_avg_sq"):
                s[key] = s[key].astype(self.moments_dtype(self.params[i]), copy=False)

    def state_bytes(self):
        """Bytes held by the optimizer states (for comparing with ZeRO's shards)."""
        return sum(v.nbytes for v in self.state_arrays())
