"""Auxiliary-loss-free load balancing (Wang et al. 2024; DeepSeek-V3 report, eq. 16): a
per-expert bias bᵢ enters only the router's top-k CHOICE, never the gate value, and after
each optimizer step moves against the load:

    choose  top-k of (sᵢ + bᵢ)            the gate stays sᵢ (normalised over the chosen)
    update  bᵢ ← bᵢ + γ · sign(mean load − loadᵢ)

loadᵢ counts the assignments every rank that routes tokens gave expert i since the last
step: the sum over the ranks that hold other tokens (dp × cp: `replicas`), not one rank's
share. An overloaded expert's bias falls until others win its marginal tokens; no gradient
is involved, so the task loss is not pulled towards balance (the auxiliary loss's cost).

The bias is float32 whatever the model computes in, and the update uses only integer loads
(summed exactly) and ±γ steps, so it is bitwise the same on every rank and on one device.
A load is counted in forwards that record a graph (training): a recomputed forward
(minitensor.recompute) runs once without a graph and once with, so each token counts once.

MaxVio (Wang et al. 2024) = (max load − mean load) / mean load: 0 is perfect balance,
E − 1 one expert taking everything.
"""
import numpy as np

from minitensor import autograd


def max_violation(load):
    """(max − mean) / mean of the per-expert loads (0: balanced; nan with no tokens)."""
    mean = load.mean()
    return float((load.max() - mean) / mean) if mean else float("nan")


class ExpertBias:
    """One MoE layer's routing bias (`value`, float32 (E,)) and the loads it balances. `rate`
    γ = 0 keeps the bias 0 (the loads and MaxVio are still measured). `replicas`: the group
    of ranks routing the other tokens of the batch (set by step_updates), None on one device."""

    def __init__(self, n_experts, rate):
        if not rate >= 0:
            raise ValueError(f"expert_bias_rate={rate} must be ≥ 0 (γ of bᵢ += γ·sign(mean load − loadᵢ))")
        self.rate, self.replicas = float(rate), None
        self.value = np.zeros(n_experts, np.float32)
        self.load = np.zeros(n_experts, np.int64)  # assignments since the last step, this rank's tokens
        self.max_violation = None  # of the last step's summed loads

    def count(self, experts):
        """Add the (N, k) chosen experts to the load, in training forwards only (see the module doc)."""
        if autograd.is_grad_enabled():
            self.load += np.bincount(experts.reshape(-1), minlength=self.value.size)

    def after_step(self):
        """Sum the loads over the replicas, move the bias, start counting afresh (every rank alike)."""
        # exercise 20.3: the loss-free balancing update
        # hint: load: the loads of every rank that routes tokens, self.load summed over self.replicas
        # hint: (all_reduce; None on one device); then in float32, an expert above the mean load gets
        # hint: its bias lowered by the rate, below it raised, at it unchanged (np.sign).
        load = self.load if self.replicas is None else self.replicas.all_reduce(self.load)
        self.value[...] = self.value + np.float32(self.rate) * np.sign(load.mean() - load).astype(np.float32)
        # end exercise
        self.max_violation = max_violation(load)
        self.load[...] = 0

    def arrays(self):
        """The floating arrays it holds between steps (memory accounting)."""
        return [self.value]

    def state_dict(self):
        return {"expert_bias": self.value.tolist(), "max_violation": self.max_violation}

    def load_state_dict(self, state):
        self.value[...] = np.asarray(state["expert_bias"], np.float32)
        self.max_violation = state["max_violation"]
