"""The FP8 Linear: y = x Wᵀ + b with its three products on FP8 operands (recipe.py), and the
scales of a model's FP8 linears kept together.

Each product casts its operands with their scales and accumulates in the layer's dtype
(float32 as on the hardware; float64 in a float64 model, the exact reference of the same
quantization): gemm.scaled_matmul. The bias, its gradient and everything outside the
linears stay in that dtype. Which layers run in FP8, as in DeepSeek-V3 §3.3: the linears
of the transformer blocks (attention's q, k, v, proj; the MLP's fc, proj; a mixture of
experts' routed and shared experts' fc, proj). The embedding, the output head, a MoE router,
the norms and attention's softmax stay in higher precision: they are small in FLOPs and
sensitive (the head's logits are read directly; a norm divides by a statistic; the router's
logits pick the experts, and a rounding that swaps two of them in a token's top-k runs another
expert: a discrete change no tolerance covers).

A mixture of experts in any layout casts as one device does (Fp8Scales, recipe.py):
    delayed     each routed expert's linears keep their own amax histories; a replica of the
                expert sees only the rows its ep group routed to it, so its amaxes are
                MAX-reduced over the ranks holding its replicas (edp: `expert_groups`), the
                dense linears' (and the shared experts') over dp × cp as before;
    blockwise   forward and dgrad tiles lie inside one token's row, whoever holds it; the
                weight gradient's tiles would run along the expert's rows, whose grouping
                depends on the layout (which ranks' tokens arrive, in what order), so a routed
                expert's wgrad reuses the per-token tiles instead (recipe.BlockwiseScaling);
    no tokens   an expert that gets no row records amax 0, which keeps the previous scale
                (scaling.scale_from_amax): never an inf or nan scale.
"""
import numpy as np

from minitensor.nn.linear import Linear

from .gemm import scaled_matmul
from .scaling import max_over


class Fp8LinearFunction(Linear):
    """y = x Wᵀ + b, every product on FP8 operands from `scaling` (a recipe's layer): Linear with
    its three products replaced."""

    def forward(self, x, weight, bias=None, scaling=None):
        self.scaling, self.dtype = scaling, x.dtype
        return super().forward(x, weight, bias)

    def product(self, x2, weight):
        a, b, self.fp8_saved = self.scaling.forward_operands(x2, weight)
        return scaled_matmul(a, b, self.dtype)

    def input_grad(self, g2):  # dx = dY W
        return scaled_matmul(*self.scaling.dgrad_operands(g2, self.fp8_saved), self.dtype)

    def weight_grad(self, g2):  # dW = dYᵀ x
        return scaled_matmul(*self.scaling.wgrad_operands(g2, self.fp8_saved), self.dtype)


def single_device_name(name):
    """A linear's name from its block on (a parallel model's modules sit under stages.N.)."""
    return name[name.index("blocks."):]


def fp8_linears(model):
    """The modules that run in FP8: the linears (modules with an `fp8` slot) inside the
    transformer blocks, but a router (its logits pick the experts: see the module docstring);
    by single-device name."""
    return {single_device_name(name): m for name, m in model.named_modules()
            if hasattr(m, "fp8") and f".{name}".find(".blocks.") >= 0 and "router" not in name}


class Fp8Scales:
    """The FP8 state of a model's linears under one recipe. `update()`, once per optimizer
    step on every rank alike: the ranks that hold parts or replicas of the same tensors take
    the MAX of each step amax (exact, so every layout sees the same amaxes), then every delayed
    scale rolls its history. `groups`: those ranks for the dense linears (tp, and the replicas
    dp × cp); `expert_groups`: for the routed experts' (tp, and the experts' replicas edp;
    default `groups`)."""

    def __init__(self, model, recipe, groups=(), grad_factor=1, expert_groups=None):
        self.groups = [g for g in groups if g.size > 1]
        self.expert_groups = self.groups if expert_groups is None else [g for g in expert_groups if g.size > 1]
        self.layers, self.routed = {}, set()  # routed: the names of the routed experts' linears
        for name, module in fp8_linears(model).items():
            routed = getattr(module, "routed", False)  # a tensor-parallel linear is no expert's
            groups = self.expert_groups if routed else self.groups  # current scaling reduces each cast over them
            module.fp8 = recipe.layer(grad_factor, rows_in_any_order=routed, groups=groups)
            self.layers[name] = module.fp8
            self.routed |= {name} if routed else set()

    def delayed(self):
        return [(f"{name}.{role}", s) for name, layer in self.layers.items()
                for role, s in layer.delayed_scales().items()]

    def update(self):
        dense, experts = [], []
        for name, s in self.delayed():
            (experts if name.rsplit(".", 1)[0] in self.routed else dense).append(s)
        for scales, groups in ((dense, self.groups), (experts, self.expert_groups)):
            if scales:  # the ranks of a group hold the same stage, so all of them or none skip
                amax = max_over(groups, np.array([s.amax for s in scales]))
                for s, value in zip(scales, amax):
                    s.amax = float(value)
                    s.update()

    def state_dict(self):
        """JSON-able: each delayed scale's scale, amax history and running amax, by name."""
        return {name: s.state_dict() for name, s in self.delayed()}

    def load_state_dict(self, state):
        """From a whole model's state (every pipeline stage's): this rank's scales take theirs."""
        mine = dict(self.delayed())
        missing = sorted(set(mine) - set(state))
        if missing:
            raise ValueError(f"FP8 scales: the checkpoint has no amax history for {missing[0]} "
                             f"({len(missing)} missing): was it saved under another recipe?")
        for name, s in mine.items():
            s.load_state_dict(state[name])
