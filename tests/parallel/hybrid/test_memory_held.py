"""The memory a rank holds between steps, found without the project's own counters: every numpy
buffer reachable from the model and its optimizer, each counted once however many views reach
it. It must equal HybridGPT.memory_bytes() and the planner's param_bytes_per_rank for ZeRO
stages 0-3 under fp32 and bf16. (Found missing: ZeRO-1 kept its flat buffer of all the
parameters and its averaged-gradient chunk from one step to the next, stage 0 its all-reduce
buckets, and under a 16-bit policy stage 0 a second copy of the master gradients.)

Two moments between steps: after the synced backward (parameters, their gradients, the
optimizer state: what the planner counts) and after optimizer_step (gradients zeroed).
"""
import functools
import types

import numpy as np
import pytest

import minitensor as mt
import parallel
from minitensor import dtypes
from minitensor.amp import precision_policy
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel import DataParallel, HybridGPT, Mesh, ZeroOptimizer, run_threads
from parallel.comm import Group
from parallel.data_parallel.flat_units import freed_placeholder
from parallel.plan import param_bytes_per_rank

CONFIG = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=2, d_model=16)
KINDS = ("params", "grads", "optim")
DP = 2
LEAVES = (type, types.ModuleType, types.BuiltinFunctionType, str, bytes, int, float, complex, type(None), np.generic)
needs_bf16 = pytest.mark.skipif(dtypes.bfloat16 is None,
                                reason="!!! ml_dtypes is NOT installed: this bfloat16 test did NOT run !!!")


def owner(array):
    """The array owning the memory `array` views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def slots(obj):
    for cls in type(obj).__mro__:
        names = getattr(cls, "__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if hasattr(obj, name):
                yield getattr(obj, name)


def reachable_buffers(*roots):
    """{id: owning array} of every numpy buffer reachable from `roots` through attributes,
    __slots__, lists, tuples, sets, dicts, bound methods, partials and closures. Communicators
    are not followed: their message slots are the transport's (under threads, shared by all
    ranks), not the model's."""
    seen, buffers, todo = set(), {}, list(roots)
    while todo:
        obj = todo.pop()
        if isinstance(obj, LEAVES + (Group,)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            memory = owner(obj)
            buffers[id(memory)] = memory
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif isinstance(obj, types.MethodType):
            todo.append(obj.__self__)
        elif isinstance(obj, functools.partial):
            todo += [obj.func, obj.args, obj.keywords]
        elif isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    todo.append(cell.cell_contents)
                except ValueError:  # a cell not filled yet
                    pass
        else:
            todo += [*getattr(obj, "__dict__", {}).values(), *slots(obj)]
    return buffers


def walked_bytes(*roots):
    """Bytes of the buffers reachable from `roots`; a freed ZeRO-3 parameter's placeholder (one
    NaN per dtype for the whole process, broadcast) is no rank's memory. Integer arrays and
    scalars are a mixture of experts' records of its last forward (tokens per expert, rows sent
    and received, the balancing loss's value), not training state."""
    buffers = [a for a in reachable_buffers(*roots).values() if a.dtype.kind not in "biu" and a.size > 1]
    shared = {id(owner(freed_placeholder((), a.dtype))) for a in buffers}
    return sum(a.nbytes for a in buffers if id(a) not in shared)


def held_between_steps(stage, precision, config=CONFIG, dp=DP, cp=1, ep=1):
    """Per rank: (walked, memory_bytes()) after the synced backward and after optimizer_step of
    the second step (the optimizer state exists), and the planner's figure."""
    def rank_fn():
        mt.manual_seed(0)
        model = HybridGPT(GPT(config, dtype=np.float32), Mesh(dp, 1, 1, cp, ep=ep), zero=stage, precision=precision)
        optimizer = model.configure_optimizer(lr=1e-2)
        idx = np.random.default_rng(0).integers(0, config.vocab_size, (2 * dp, config.block_size))
        for _ in range(2):
            model.train_step(idx, np.roll(idx, -1, axis=1))
            model.finish_grad_sync()
            synced = walked_bytes(model, optimizer), model.memory_bytes()
            model.optimizer_step()
            stepped = walked_bytes(model, optimizer), model.memory_bytes()
        assert model.amp.skipped == 0
        return synced, stepped, param_bytes_per_rank(config, dp, 1, 1, model.mesh.coords, precision, stage, cp=cp,
                                                     ep=ep)
    return run_threads(dp * cp, rank_fn, timeout=60)


MOE = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=2, d_model=16, n_experts=4, moe_every=2)
DEEPSEEK = GPTConfig(vocab_size=12, block_size=8, n_layer=2, n_head=2, d_model=16, n_experts=4, top_k=2,
                     expert_hidden=8, shared_experts=1, router_score="sigmoid", expert_bias_rate=0.01)


# (layout, precision): a mixture of experts trains in float32 only (a 16-bit policy is refused: routing
# would differ by layout)
# would differ by layout); bfloat16 AdamW moments (the policy's moment_dtype) are 2 bytes each
LAYOUTS = [({}, "fp32"), pytest.param({}, "bf16", marks=needs_bf16), ({"config": MOE, "dp": 4, "ep": 2}, "fp32"),
           ({"config": MOE, "dp": 2, "cp": 2, "ep": 2}, "fp32"), ({"config": DEEPSEEK, "dp": 4, "ep": 2}, "fp32"),
           pytest.param({}, "fp32+bf16-moments", marks=needs_bf16), pytest.param({}, "bf16+bf16-moments", marks=needs_bf16)]


def policy_named(name):
    """"fp32", or "fp32+bf16-moments": the policy with its AdamW moments in bfloat16."""
    name, _, moments = name.partition("+")
    return precision_policy(name, moment_dtype="bfloat16") if moments else name


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("layout, precision", LAYOUTS, ids=["dense", "dense-bf16", "experts", "experts-cp", "deepseek",
                                                            "dense-bf16-moments", "dense-bf16-bf16-moments"])
def test_the_arrays_reachable_between_steps_are_memory_bytes_and_the_planners_figure(stage, precision, layout):
    for rank, ((walked, memory), (walked_after, memory_after), planner) in enumerate(
            held_between_steps(stage, policy_named(precision), **layout)):
        where = f"rank {rank}, ZeRO-{stage}, {precision}"
        assert {k: memory[k] for k in KINDS} == planner, where
        assert walked == sum(memory[k] for k in KINDS) == sum(planner.values()), where
        # after the step: no flat buffer or gradient chunk left over from it, only what memory_bytes counts
        assert walked_after == sum(memory_after[k] for k in KINDS), where
        assert {k: memory_after[k] for k in ("params", "optim")} == {k: planner[k] for k in ("params", "optim")}, where
        assert memory_after["grads"] <= planner["grads"], where  # zeroed: freed, or kept (a flat array, shards)


def test_zero_1_and_data_parallel_hold_nothing_beyond_the_model_and_the_moments():
    # ZeroOptimizer on a plain model: between steps, its chunk of the moments and nothing else;
    # DataParallel: its reducer holds no flat copy of the gradients
    def rank_fn():
        group, held = parallel.world(), {}
        for name in ("zero", "ddp"):
            mt.manual_seed(0)
            model = GPT(CONFIG, dtype=np.float64)
            wrapped = DataParallel(model, group) if name == "ddp" else model
            optimizer = AdamW(model.parameters()) if name == "ddp" else ZeroOptimizer(model.parameters(), group)
            idx = np.random.default_rng(group.rank).integers(0, CONFIG.vocab_size, (2, CONFIG.block_size))
            for _ in range(2):
                optimizer.zero_grad()
                wrapped(idx, np.roll(idx, -1, axis=1))[1].backward()
                optimizer.step()
            held[name] = (walked_bytes(wrapped, optimizer) - walked_bytes(model),  # the optimizer's and the reducer's
                          walked_bytes(wrapped, optimizer) - walked_bytes(model, optimizer),  # the reducer's alone
                          optimizer.state_bytes())
        return held

    for held in run_threads(DP, rank_fn, timeout=60):
        beyond_model, _, state = held["zero"]
        assert beyond_model == state  # the moments' chunk: no flat buffer, no gradient chunk
        assert held["ddp"][1] == 0
