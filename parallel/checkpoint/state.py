"""A rank's training state as arrays by single-device name, and back.

The checkpoint never asks which kind of parallel model it holds (parallel.hybrid.parallel_model's
`ParallelModel` interface: named_parameters, named_modules, optimizer); it needs only

    parameters     name -> Parameter (single-device names; a tp shard is described by
                   tensor_parallel.sharding's `tp_axis` and `dense_shape`): the parameters
                   the optimizer steps, so under a mixed precision policy the float32
                   masters (the 16-bit compute copies are their rounding)
    moments        name -> AdamW's exp_avg, exp_avg_sq and step count. Plain AdamW keeps
                   them by position in its parameter list, ZeRO-1 as one flat chunk of
                   the dp group's concatenated parameters: both are mapped to names here
                   (a ZeRO chunk gives each name a flat element range [lo, hi)). They are
                   saved in their dtype (bfloat16 moments as their uint16 bits, `file_bits`:
                   the manifest's optimizer.moment_dtype reads them back) and loaded into the
                   optimizer's own (a bfloat16 → float32 resume is exact; float32 → bfloat16
                   rounds to nearest even, as the next step's store would)
    rank states    what one rank holds for itself, restored in the same layout only
                   (rank_state_holders): the dp gradient compressor's state (parallel.data_parallel.comm_hooks,
                   per bucket) and local SGD's outer optimizer (parallel.data_parallel.local_sgd: the
                   anchor, the Nesterov buffer, the inner steps since the last outer step)
    generators     every numpy Generator the model's modules draw dropout masks from,
                   plus minitensor's default generator, by where they were found
"""
import json
from collections import OrderedDict

import numpy as np

from minitensor import nn
from minitensor.optim import AdamW
from minitensor.random import default_generator

from ..data_parallel.zero import ZeroOptimizer

MOMENTS = ("exp_avg", "exp_avg_sq")


def rank_state_holders(model):
    """Per-rank states: the prefix of their arrays in a shard file -> what holds them (state_dict /
    load_state_dict), None when the run does not use it (ParallelModel declares both)."""
    return {"comm_hook/": model.comm_hook,  # the dp communication hook: error feedback, PowerSGD's Q
            "outer/": model.outer}  # local SGD / DiLoCo's outer optimizer


def named_parameters(model):
    return OrderedDict(model.named_master_parameters())


def optimizer_type(optimizer):
    if optimizer is None:
        return None
    if not isinstance(optimizer, (AdamW, ZeroOptimizer)):
        raise TypeError(f"checkpoints hold AdamW or ZeroOptimizer state, got {type(optimizer).__name__}")
    return type(optimizer).__name__


def names_by_id(params, optimizer):
    """id(parameter) -> name for the optimizer's parameters, which the model must all hold."""
    names = {id(p): name for name, p in params.items()}
    strangers = [i for i, p in enumerate(optimizer.params) if id(p) not in names]
    if strangers:
        raise ValueError(f"the optimizer's parameters at positions {strangers} are not parameters of the model")
    return names


def moments_by_name(optimizer, params):
    """{name: {"step", "range", "exp_avg", "exp_avg_sq"}}; range is None for whole arrays
    (AdamW) or the [lo, hi) flat elements this rank's ZeRO chunk holds."""
    if optimizer is None:
        return {}
    names = names_by_id(params, optimizer)
    if isinstance(optimizer, ZeroOptimizer):
        return {names[id(p)]: {"step": optimizer.step_count, "range": [lo, hi],
                               "exp_avg": optimizer.exp_avg[offset:offset + hi - lo],
                               "exp_avg_sq": optimizer.exp_avg_sq[offset:offset + hi - lo]}
                for p, lo, hi, offset in optimizer.param_slices()}
    return {names[id(optimizer.params[i])]: {"step": s["step"], "range": None,
                                             "exp_avg": s["exp_avg"], "exp_avg_sq": s["exp_avg_sq"]}
            for i, s in optimizer.state.items()}


def moment_dtype(optimizer):
    """The dtype name the optimizer keeps its moments in (None without an optimizer)."""
    if optimizer is None:
        return None
    if isinstance(optimizer, ZeroOptimizer):
        return optimizer.exp_avg.dtype.name
    return optimizer.moments_dtype(optimizer.params[0]).name


def file_bits(array):
    """What a shard file holds for `array`: npz keeps numpy's own dtypes only, so a bfloat16
    array is written as its uint16 bits (read back with .view(the saved moment dtype))."""
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def load_moments(optimizer, params, moments, defaults):
    """Set the optimizer from whole (local-shaped) moments {name: (step, exp_avg, exp_avg_sq)}
    and the saved hyper-parameters."""
    if optimizer is None:
        return
    names = names_by_id(params, optimizer)
    optimizer.defaults.update(defaults, betas=tuple(defaults["betas"]))
    if isinstance(optimizer, ZeroOptimizer):
        steps = {step for step, _, _ in moments.values()}
        if len(steps) > 1:
            raise ValueError(f"ZeroOptimizer keeps one step count, but the checkpoint has {sorted(steps)}")
        by_id = {id(p): moments[names[id(p)]][1:] for p in optimizer.flat_params if names[id(p)] in moments}
        optimizer.load_param_moments(by_id, steps.pop() if steps else 0)
        return
    optimizer.state = {}
    for i, p in enumerate(optimizer.params):
        if names[id(p)] in moments:
            step, exp_avg, exp_avg_sq = moments[names[id(p)]]
            dtype = optimizer.moments_dtype(p)  # the optimizer's setting: a saved moment is converted to it
            optimizer.state[i] = {"step": step, "exp_avg": np.array(exp_avg, dtype=dtype),
                                  "exp_avg_sq": np.array(exp_avg_sq, dtype=dtype)}


def generators_in(value):
    """[(suffix, Generator)]: the value itself, or the Generators a plain holder object
    (a TensorParallelRNG) keeps as attributes. Modules are not looked into: the walk visits them."""
    if isinstance(value, np.random.Generator):
        return [("", value)]
    if isinstance(value, nn.Module):
        return []
    return [(f".{k}", v) for k, v in getattr(value, "__dict__", {}).items() if isinstance(v, np.random.Generator)]


def named_generators(model):
    """{where: Generator}: minitensor's default generator (this thread's), then every
    Generator held by a module (a Dropout's `generator`, a TensorParallelRNG's two
    streams), each listed once under the first place it is found."""
    found = OrderedDict(default=default_generator())
    seen = {id(found["default"])}
    for module_name, module in model.named_modules():
        for attr, value in vars(module).items():
            for suffix, generator in generators_in(value):
                if id(generator) not in seen:
                    seen.add(id(generator))
                    found[".".join(filter(None, (module_name, attr + suffix)))] = generator
    return found


def rng_state_json(model):
    return json.dumps({where: g.bit_generator.state for where, g in named_generators(model).items()})


def set_rng_state_json(model, text):
    """Restore the generators saved by rng_state_json (same model layout: same places)."""
    saved, generators = json.loads(text), named_generators(model)
    if set(saved) != set(generators):
        raise ValueError(f"the saved random generators {sorted(saved)} do not match the model's "
                         f"{sorted(generators)}")
    for where, g in generators.items():
        g.bit_generator.state = saved[where]


def rank_states(model):
    """{prefix + key: array}: the state_dicts of the model's per-rank states (rank_state_holders)."""
    arrays = {}
    for prefix, holder in rank_state_holders(model).items():
        if holder is not None:
            arrays.update({prefix + k: v for k, v in holder.state_dict().items()})
    return arrays


def set_rank_states(model, arrays):
    """Load rank_states' {prefix + key: array} into the model's holders that are in use."""
    for prefix, holder in rank_state_holders(model).items():
        state = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        if holder is not None and state:
            holder.load_state_dict(state)
