"""`Module`: parameters and submodules registered by attribute, named like PyTorch."""
from collections import OrderedDict

import numpy as np

from minitensor.tensor import Tensor


class Parameter(Tensor):
    """A tensor that a Module owns and an optimizer updates."""

    def __init__(self, data, requires_grad=True):
        super().__init__(np.asarray(data.data if isinstance(data, Tensor) else data), requires_grad)

    def __repr__(self):
        return "Parameter(" + super().__repr__() + ")"


class Module:
    """Base class: assigning a Parameter or a Module to an attribute registers it.

    Names follow registration order, so `named_parameters()` is deterministic and the
    same in every process.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        # Replacing a parameter or module keeps its place in the order (as in PyTorch), so
        # swapping a layer for, say, its tensor-parallel version does not reorder the names.
        target = (self._parameters if isinstance(value, Parameter)
                  else self._modules if isinstance(value, Module) else None)
        for registry in (self._parameters, self._modules):
            if registry is not target:
                registry.pop(name, None)
        if target is not None:
            target[name] = value
        object.__setattr__(self, name, value)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    # ---- traversal ---------------------------------------------------------------
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, module in self._modules.items():
            yield from module.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return (m for _, m in self.named_modules())

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self, prefix=""):
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if id(param) not in seen:  # a shared parameter is listed once
                    seen.add(id(param))
                    yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    # ---- training helpers ----------------------------------------------------------
    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def step_updates(self, replicas=None):
        """State this module moves after each optimizer step, outside the gradient (objects with
        after_step(), state_dict(), load_state_dict(), arrays()): none by default. `replicas`: the group of
        ranks that see the other tokens of the batch, None on one device."""
        return []

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def to(self, dtype):
        """Convert every parameter to `dtype` in place (e.g. np.float64 for tests)."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
            p.grad = None
        return self

    def double(self):
        return self.to(np.float64)

    def float(self):
        return self.to(np.float32)

    # ---- checkpoints ---------------------------------------------------------------
    def state_dict(self):
        """name → copy of the parameter's numpy array."""
        return OrderedDict((name, p.data.copy()) for name, p in self.named_parameters())

    def load_state_dict(self, state, strict=True):
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        loadable = {name: np.asarray(value) for name, value in state.items() if name in params}
        for name, value in loadable.items():  # check every shape before changing any parameter
            if value.shape != params[name].shape:
                raise ValueError(f"load_state_dict: '{name}' has shape {value.shape} in the checkpoint "
                                 f"but {params[name].shape} in the model")
        for name, value in loadable.items():
            params[name].data[...] = value
        return missing, unexpected

    def num_parameters(self):
        return sum(p.size for p in self.parameters())


class ModuleList(Module):
    """A list of modules registered under their index: `blocks.0`, `blocks.1`, ..."""

    def __init__(self, modules=()):
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module):
        setattr(self, str(len(self._modules)), module)

    def __getitem__(self, i):
        items = list(self._modules.values())
        return ModuleList(items[i]) if isinstance(i, slice) else items[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
