"""The FP8 Linear: y = x Wᵀ + b with its three products on FP8 operands (recipe.py), and the
scales of a model's FP8 linears kept together.

Each product casts its operands with their scales and accumulates in the layer's dtype
(float32 as on the hardware; float64 in a float64 model, the exact reference of the same
quantization): gemm.scaled_matmul. The bias, its gradient and everything outside the
linears stay in that dtype. Which layers run in FP8, as in DeepSeek-V3 §3.3: the linears
of the transformer blocks (attention's q, k, v, proj; the MLP's fc, proj). The embedding,
the output head, a MoE router, the norms and attention's softmax stay in higher precision:
they are small in FLOPs and sensitive (the head's logits and the router's choice are read
directly; a norm divides by a statistic).
"""
import numpy as np

from minitensor.nn.linear import Linear

from .gemm import scaled_matmul


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
    transformer blocks, but a router; by single-device name."""
    return {single_device_name(name): m for name, m in model.named_modules()
            if hasattr(m, "fp8") and f".{name}".find(".blocks.") >= 0 and "router" not in name}


class Fp8Scales:
    """The FP8 state of a model's linears under one recipe. `update()`, once per optimizer
    step on every rank alike: the ranks that hold parts of the same tensors (`groups`: tp,
    and the replicas dp × cp) take the MAX of each step amax (exact, so every layout sees the
    same amaxes), then every delayed scale rolls its history."""

    def __init__(self, model, recipe, groups=(), grad_factor=1):
        self.groups = [g for g in groups if g.size > 1]
        self.layers = {}
        for name, module in fp8_linears(model).items():
            module.fp8 = recipe.layer(grad_factor)
            self.layers[name] = module.fp8

    def delayed(self):
        return [(f"{name}.{role}", s) for name, layer in self.layers.items()
                for role, s in layer.delayed_scales().items()]

    def update(self):
        scales = [s for _, s in self.delayed()]
        if not scales:
            return
        amax = np.array([s.amax for s in scales])
        for group in self.groups:
            group.all_reduce(amax, op="max")
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
