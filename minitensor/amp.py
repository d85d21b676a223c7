"""Mixed precision: compute in 16 bits, keep the weights and the optimizer in float32.

    policy = precision_policy("fp16")            # compute float16; masters, reduction float32; loss scaling
    amp = MixedPrecision(model.parameters(), policy)  # the model now computes in float16
    optimizer = AdamW(amp.masters, lr=1e-3)       # the optimizer steps the float32 master weights
    _, loss = model(idx, targets)
    amp.backward(loss)                            # (loss · scale).backward()
    amp.grads_to_master()                         # 16-bit gradients → the masters' .grad (exact)
    amp.step(optimizer)                           # unscale; skip if inf/nan; step; masters → 16-bit copies
    amp.zero_grad()

Why each part (Micikevicius et al. 2018, "Mixed Precision Training"):

* Master weights in float32. An AdamW update is ~lr = 1e-3 of a weight's size; float16
  keeps 11 significant bits, so w + Δ rounds back to w once |Δ| < 2⁻¹²·|w|, and small
  updates vanish. The moments need float32 too: v = g² of a gradient of 1e-4 is 1e-8,
  below float16's smallest subnormal (6e-8).
* Gradients reduced in float32 (the masters' gradients are what the reducer sums): a sum
  of N float16 values rounds N − 1 times, and the loss scaler pushes gradients towards
  float16's top (65504), where a sum of finite values can overflow; the layout (N) would
  then decide which steps are skipped.
* Loss scaling (float16 only). Small gradients fall below 2⁻²⁴ and flush to zero. The
  loss is multiplied by S before backward, so every gradient is S times larger, and the
  float32 gradients are divided by S before the step. With S a power of two this is
  exact: multiplying by 2ᵏ changes only the exponent, so scale-then-unscale gives the
  same bits unless a value overflows (inf) or was subnormal. bfloat16 has float32's
  exponent range and needs none.
* The dynamic scaler: start high (2¹⁶); a step whose gradients hold an inf or nan is
  skipped and S halved; after `growth_interval` clean steps S doubles. Every rank must
  skip the same steps, so the found-inf flag is MAX-all-reduced over every group that
  holds gradients (`groups`) before anyone decides.
* FP8 (fp8-current, fp8-delayed, fp8-blockwise; minitensor.fp8): the blocks' linears (experts' too) multiply FP8
  operands; the rest, masters and moments keep the model's dtype (float64: the exact reference). Scales roll in `step`.
"""
import contextlib
from dataclasses import dataclass

import numpy as np

from minitensor import dtypes
from minitensor.nn.module import Parameter


@dataclass(frozen=True)
class PrecisionPolicy:
    """Where rounding happens: the dtype the model computes in (its parameters' compute
    copies and activations), the master weights' and optimizer states' dtype, the dtype
    gradients are reduced in, and whether the loss is dynamically scaled."""

    name: str
    compute_dtype: np.dtype
    master_dtype: np.dtype
    reduce_dtype: np.dtype
    loss_scaling: bool = False
    fp8: object = None  # a minitensor.fp8.recipe.Fp8Recipe: the blocks' linears run in FP8
    moment_dtype: str = None  # AdamW's moments: None (the masters' dtype) or "bfloat16" (minitensor.narrow_moments)

    def __post_init__(self):
        if np.dtype(self.reduce_dtype) != np.dtype(self.master_dtype):
            raise ValueError(f"precision policy {self.name}: gradients are reduced on the master copies, so the "
                             f"reduce dtype ({self.reduce_dtype}) must be the master dtype ({self.master_dtype})")

    @property
    def mixed(self):
        """True when the model computes in another dtype than the masters (16-bit compute)."""
        return np.dtype(self.compute_dtype) != np.dtype(self.master_dtype)

    def grad_scaler(self, **settings):
        """A GradScaler for this policy: dynamic under loss scaling, else disabled (scale 1)."""
        return GradScaler(enabled=self.loss_scaling, **settings)


def _uniform(name, dtype, moment_dtype=None):
    return PrecisionPolicy(name, np.dtype(dtype), np.dtype(dtype), np.dtype(dtype), moment_dtype=moment_dtype)


POLICIES = ("fp64", "fp32", "fp16", "bf16", "fp8-current", "fp8-delayed", "fp8-blockwise")


def precision_policy(name, dtype=dtypes.float32, moment_dtype=None, **fp8_settings):
    """The policy called `name`: fp64 and fp32 compute, keep and reduce in one dtype (fp64 is the tests'
    reference); fp16 computes in float16 with loss scaling; bf16 in bfloat16; fp8-* keep `dtype` throughout
    but for the blocks' products (fp8_settings: the recipe's). `moment_dtype`: AdamW's moments (narrow_moments)."""
    if fp8_settings and not name.startswith("fp8-"):
        raise ValueError(f"precision {name!r} has no FP8 recipe to take {sorted(fp8_settings)}")
    if name.startswith("fp8-") and name in POLICIES:
        from minitensor.fp8.recipe import Fp8Recipe  # noqa: I001  (the FP8 package loads only when used)
        return PrecisionPolicy(name, np.dtype(dtype), np.dtype(dtype), np.dtype(dtype),
                               fp8=Fp8Recipe(name[4:], **fp8_settings), moment_dtype=moment_dtype)
    if name in ("fp64", "fp32"):
        return _uniform(name, dtypes.float64 if name == "fp64" else dtypes.float32, moment_dtype)
    if name == "fp16":
        return PrecisionPolicy("fp16", np.dtype(dtypes.float16), np.dtype(dtypes.float32), np.dtype(dtypes.float32),
                               loss_scaling=True, moment_dtype=moment_dtype)
    if name == "bf16":
        if dtypes.bfloat16 is None:
            raise ValueError("precision bf16 needs the ml_dtypes package: pip install -e '.[bf16]'")
        return PrecisionPolicy("bf16", np.dtype(dtypes.bfloat16), np.dtype(dtypes.float32), np.dtype(dtypes.float32),
                               moment_dtype=moment_dtype)
    raise ValueError(f"precision {name!r} is not one of {POLICIES}")


def policy_of_dtype(dtype):
    """The uniform policy of a model built in `dtype` (float32 or float64): what it does without one."""
    names = {np.dtype(dtypes.float64): "fp64", np.dtype(dtypes.float32): "fp32"}
    return _uniform(names.get(np.dtype(dtype), str(np.dtype(dtype))), dtype)


class GradScaler:
    """Dynamic loss scaling, with PyTorch's names and defaults (torch.amp.GradScaler), plus
    DeepSpeed's floor `min_scale`. Disabled, the scale is 1 and nothing is ever skipped."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 min_scale=1.0, enabled=True):
        problems = [f"{name}={value!r}" for name, value, ok in (
            ("init_scale", init_scale, init_scale > 0), ("growth_factor", growth_factor, growth_factor > 1),
            ("backoff_factor", backoff_factor, 0 < backoff_factor < 1),
            ("growth_interval", growth_interval, isinstance(growth_interval, int) and growth_interval >= 1),
            ("min_scale", min_scale, 0 < min_scale <= init_scale)) if not ok]
        if problems:
            raise ValueError(f"GradScaler: {', '.join(problems)} (need init_scale > 0, growth_factor > 1, "
                             f"0 < backoff_factor < 1, an int growth_interval ≥ 1, 0 < min_scale ≤ init_scale)")
        self.enabled = enabled
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.min_scale = growth_interval, float(min_scale)
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_tracker = 0  # clean steps since the scale last changed

    def get_scale(self):
        return self.scale

    def unscale_(self, grads):
        """Divide every gradient (float32 arrays) by the scale, in place; True if any holds inf/nan."""
        inverse = 1.0 / self.scale  # exact for a power-of-two scale
        found_inf = False
        for g in grads:
            g *= inverse
            found_inf = found_inf or not np.isfinite(g).all()
        return found_inf

    def update(self, found_inf):
        """The scale for the next step, from whether this one's gradients overflowed (on every rank)."""
        # exercise 15.1: the loss scaler's update
        # hint: an overflow multiplies the scale by backoff_factor (never below min_scale) and restarts
        # hint: the count of clean steps; growth_interval clean steps in a row multiply it by growth_factor.
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale *= self.growth_factor
                self.growth_tracker = 0
        # end exercise

    def state_dict(self):
        """JSON-able: kept in checkpoints, so a resumed run continues the same scale trajectory."""
        return {"scale": self.scale, "growth_tracker": self.growth_tracker, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "min_scale": self.min_scale, "enabled": self.enabled}

    def load_state_dict(self, state):
        if bool(state["enabled"]) != self.enabled:
            raise ValueError(f"GradScaler.load_state_dict: the saved scaler is "
                             f"{'enabled' if state['enabled'] else 'disabled'}, this one is not")
        self.scale, self.growth_tracker = float(state["scale"]), int(state["growth_tracker"])
        self.growth_factor, self.backoff_factor = float(state["growth_factor"]), float(state["backoff_factor"])
        self.growth_interval, self.min_scale = int(state["growth_interval"]), float(state["min_scale"])


def master_copy(p, dtype):
    """A `dtype` Parameter holding p's values, with p's requires_grad and tensor-parallel tags."""
    master = Parameter(p.data.astype(dtype), requires_grad=p.requires_grad)
    for tag in ("tp_axis", "full_shape", "tp_partial_grad"):
        if hasattr(p, tag):
            setattr(master, tag, getattr(p, tag))
    return master


class MixedPrecision:
    """One rank's side of a precision policy: its parameters become 16-bit compute copies of
    float32 `masters`, which the optimizer steps; `scaler` is the policy's loss scaler.

    Under a uniform policy (fp32, fp64) the masters ARE the parameters and every method reduces to
    what training does without this class: same arithmetic, same bits. groups: the groups whose ranks
    hold other gradients of the same model (dp, tp, pp); the found-inf flag is MAX-all-reduced over
    each, so every rank skips alike. Under an FP8 policy, `model`'s blocks' linears get the recipe's
    scaling (minitensor.fp8.linear.Fp8Scales, amaxes MAX-reduced over `amax_groups`, a routed expert's
    over `expert_amax_groups`; grad_factor: see minitensor.fp8.recipe).
    """

    def __init__(self, params, policy, groups=(), model=None, amax_groups=(), grad_factor=1, expert_amax_groups=None,
                 **scaler_settings):
        self.params, self.policy = list(params), policy
        self.groups = [g for g in groups if g.size > 1]
        self.scaler = policy.grad_scaler(**scaler_settings)
        self.mixed = policy.mixed
        wrong = sorted({str(p.dtype) for p in self.params} - {str(np.dtype(policy.master_dtype))})
        if wrong:
            raise ValueError(f"precision {policy.name}: build the model in {np.dtype(policy.master_dtype)} "
                             f"(its master dtype), got parameters of {wrong}")
        if self.mixed:
            self.masters = [master_copy(p, policy.master_dtype) for p in self.params]
            for p in self.params:
                p.data, p.grad = p.data.astype(policy.compute_dtype), None
        else:
            self.masters = self.params
        self.sharded_grads = None  # set by hand_over_masters: the masters live in flat shards elsewhere
        self.skipped = 0  # steps skipped for an inf/nan gradient
        self.fp8 = None  # under an FP8 policy: the scales of `model`'s FP8 linears, agreed over `amax_groups`
        if policy.fp8 is not None:
            from minitensor.fp8.linear import Fp8Scales  # noqa: I001
            self.fp8 = Fp8Scales(model, policy.fp8, amax_groups, grad_factor, expert_amax_groups)

    def hand_over_masters(self, sharded_grads):
        """ZeRO-2/3 (parallel.data_parallel.flat_units.shard_masters): each rank keeps 1/n of the
        float32 masters as flat chunks, which the sharded optimizer steps and rounds into the
        compute copies; the whole masters go. The parameters stand for the masters by name (a
        gather fills their .data with the masters' values); `sharded_grads()` returns the masters'
        gradient chunks the scaler unscales; grads_to_master, masters_to_params and
        params_hold_masters leave the parameters alone (the reducer, optimizer and gather work)."""
        self.masters, self.sharded_grads = self.params, sharded_grads

    @property
    def keeps_whole_masters(self):
        """Whether the masters are whole float32 arrays of their own: a mixed policy whose
        masters were not handed over to ZeRO-2/3's shards."""
        return self.mixed and self.sharded_grads is None

    def backward(self, loss):
        """(loss · scale).backward(), with the scale seeded as the loss's gradient."""
        loss.backward(np.asarray(self.scaler.scale, loss.dtype))

    def grads_to_master(self, divisor=1):
        """Each parameter's gradient / divisor into its master's .grad, in the master dtype
        (the float16 → float32 cast is exact; the division happens in float32); into the
        master's place in the optimizer's flat gradient (flat_params) once it has one, so the
        master gradient is held once, not a fresh copy beside the flat one."""
        if self.sharded_grads is not None:  # the sharded reducer wrote the masters' gradient chunks
            return
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                m.grad = None
            elif self.mixed:
                m.grad = np.divide(p.grad, divisor, dtype=self.policy.master_dtype, out=m._grad_slot)
            elif divisor != 1:
                p.grad /= divisor

    def found_inf(self):
        """Unscale the masters' gradients in place; whether any rank of `groups` saw an inf/nan."""
        grads = self.sharded_grads() if self.sharded_grads is not None else [m.grad for m in self.masters
                                                                              if m.grad is not None]
        found = self.scaler.unscale_(grads)
        flag = np.array([found], dtype=np.int64)
        for group in self.groups:  # after tp, pp and dp, every rank of the mesh has the world's MAX
            group.all_reduce(flag, op="max")
        return bool(flag[0])

    def step(self, optimizer):
        """Unscale, agree on overflow, update the scale; if no rank overflowed, step `optimizer`
        (over the masters) and round the masters into the compute copies. Returns whether it stepped."""
        if self.scaler.enabled:
            overflow = self.found_inf()
            self.scaler.update(overflow)
            if overflow:
                self.skipped += 1
                return False
        optimizer.step()
        self.masters_to_params()
        if self.fp8 is not None:
            self.fp8.update()
        return True

    def masters_to_params(self):
        """Round every master into its compute copy (round to nearest even), in place."""
        if self.keeps_whole_masters:
            for p, m in zip(self.params, self.masters):
                p.data[...] = m.data

    def zero_grad(self):
        for p in self.params + (self.masters if self.mixed else []):
            p.grad = None

    @contextlib.contextmanager
    def params_hold_masters(self):
        """Inside the block each parameter's .data and .grad are its master's (unscaled: the
        caller divides by the scale), so code that reads or writes parameters by name (a
        gather, a loader) reaches the float32 masters; the compute copies are refreshed after."""
        if not self.keeps_whole_masters:
            yield
            return
        saved = [(p.data, p.grad) for p in self.params]
        for p, m in zip(self.params, self.masters):
            p.data, p.grad = m.data, m.grad
        try:
            yield
        finally:
            for p, (data, grad) in zip(self.params, saved):
                p.data, p.grad = data, grad
            self.masters_to_params()
