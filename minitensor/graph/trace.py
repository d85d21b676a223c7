"""Capture: run a function once and record every op it applies as a graph.

    gm = graph.trace(model.forward, idx, targets)  # a GraphModule holding gm.graph
    logits, loss = gm(idx, targets)                # runs the graph: bitwise what model.forward gives
    loss.backward()                                # into the parameters' .grad, bitwise as eager
    print(gm.graph.table())

While `fn` runs, `autograd.record_ops` reports each `Function.apply` (its class, input
tensors, keyword params and output); a tensor the recorder has not seen yet becomes a
leaf: a graph input if it is one of `example_inputs`, a parameter if it is one of the
module's (named by `named_parameters()`) or requires grad (named "param_0", ...),
otherwise a constant (its array kept in attrs["value"]).

A trace records one path through `fn`, as `torch.jit.trace` does: Python control flow
and numpy work done outside ops are frozen at their traced values. So reading a traced
tensor's value in Python (`if x.sum().item() > 0:`) raises TraceError naming the line
(trace_checks.py). Inputs given as numpy arrays (token ids) must reach ops unchanged as
keyword params (`Embedding`'s idx, `CrossEntropy`'s targets); running the graph puts the
new arrays there. Random ops (dropout in training mode) are frozen too, with a warning:
trace a model in eval mode or with dropout 0.
"""
import inspect
from types import SimpleNamespace

import numpy as np

from minitensor.autograd import record_ops
from minitensor.graph.eager import flops, saved_arrays
from minitensor.graph.graph_module import GraphModule
from minitensor.graph.ir import Graph, Node
from minitensor.graph.trace_checks import refuse_value_read, warn_if_dropout
from minitensor.nn.module import Module
from minitensor.tensor import Tensor


def _bias_pass(inputs, out):
    """Linear with a bias adds it in place after the GEMM (`y += bias`): one more read and
    write of the output."""
    return 2 * out.nbytes if len(inputs) == 3 else 0


# Extra bytes an op's kernel moves beyond reading its inputs and writing its output once.
BYTE_RULES = {"Linear": _bias_pass}


def bytes_moved(op, inputs, out):
    """(read, written): the inputs' and the output's bytes, plus BYTE_RULES; (0, 0) when
    the output is a view of an input (numpy's reshape, transpose and basic slicing)."""
    arrays = [t.data for t in inputs]
    if any(np.may_share_memory(out, a) for a in arrays):
        return 0, 0
    extra = BYTE_RULES[op](inputs, out) if op in BYTE_RULES else 0
    return sum(a.nbytes for a in arrays) + extra // 2, out.nbytes + extra // 2


def _buffer(array):
    """The array a view looks into (itself if it owns its data)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class Recorder:
    """Builds the node list from the `record_ops` callbacks of one traced run."""

    def __init__(self, inputs, params):
        self.nodes, self.names, self.counts = [], {}, {}
        self.keep = []  # every tensor seen stays alive during the trace, so no id is reused
        self.params = dict(params)
        self.param_names = {id(p): name for name, p in params.items()}
        self.param_buffers = {id(_buffer(p.data)) for p in params.values()}
        self.array_inputs = {}
        self.counted = set()  # saved regions already counted
        # tensors whose value running the graph can change: inputs, parameters, ops of either
        self.dynamic = set(self.param_names)
        for name, value in inputs.items():
            data = value.data if isinstance(value, Tensor) else np.asarray(value)
            if isinstance(value, Tensor):
                self.names[id(value)] = name
                self.dynamic.add(id(value))
            else:
                self.array_inputs[id(value)] = name
            self.keep.append(value)
            self.nodes.append(Node(name, "input", shape=data.shape, dtype=data.dtype))

    def fresh(self, op):
        k = self.counts.get(op, 0)
        self.counts[op] = k + 1
        return f"{op.lower()}_{k}"

    def name_of(self, tensor):
        """The node of `tensor`, adding a parameter or constant leaf when first seen."""
        if id(tensor) not in self.names:
            if id(tensor) in self.param_names or tensor.requires_grad:
                name = self.param_names.get(id(tensor)) or f"param_{len(self.params)}"
                self.params[name] = tensor
                self.param_buffers.add(id(_buffer(tensor.data)))
                self.dynamic.add(id(tensor))
                node = Node(name, "param", shape=tensor.shape, dtype=tensor.dtype)
            else:
                name = self.fresh("constant")
                node = Node(name, "constant", shape=tensor.shape, dtype=tensor.dtype, attrs={"value": tensor.data})
            self.nodes.append(node)
            self.names[id(tensor)] = name
            self.keep.append(tensor)
        return self.names[id(tensor)]

    def is_dynamic(self, tensor):
        """Whether `tensor`'s value depends on the graph's inputs or parameters (a tensor
        that requires grad and is not seen yet would become a parameter)."""
        return id(tensor) in self.dynamic or tensor.requires_grad

    def value_read(self, tensor, how):
        """Called by Tensor when its value goes to Python (autograd.value_read): refused for a
        value the graph's inputs decide, which the graph could not follow."""
        if self.is_dynamic(tensor):
            raise refuse_value_read(how)

    def rebound(self, tensor, source):
        """`tensor` stands for `source`'s node from now on (autograd.rebound: an in-place op rebinds it)."""
        self.names[id(tensor)] = self.name_of(source)
        self.keep.append(tensor)
        if id(source) in self.dynamic:
            self.dynamic.add(id(tensor))

    def saved_bytes(self, function):
        """Bytes of the activations `function` keeps that no earlier node keeps."""
        total = 0
        for a in saved_arrays(function):
            base = _buffer(a)
            region = (id(base), a.__array_interface__["data"][0], a.nbytes)
            if id(base) not in self.param_buffers and region not in self.counted:
                self.counted.add(region)
                total += a.nbytes
        return total

    def __call__(self, cls, inputs, params, function, result):
        op = cls.__name__
        names = tuple(self.name_of(t) for t in inputs)
        attr_inputs = tuple((k, self.array_inputs[id(v)]) for k, v in params.items() if id(v) in self.array_inputs)
        read, written = bytes_moved(op, inputs, result.data)
        name = self.fresh(op)
        self.nodes.append(Node(
            name, op, names, result.shape, result.dtype, dict(params),
            flops=flops(SimpleNamespace(name=op, inputs=inputs), result.shape),
            bytes_read=read, bytes_written=written, saved_bytes=self.saved_bytes(function),
            attr_inputs=attr_inputs))
        self.names[id(result)] = name
        self.keep.append(result)
        if attr_inputs or any(id(t) in self.dynamic for t in inputs):
            self.dynamic.add(id(result))


def input_names(fn, count):
    """The names of fn's first `count` positional parameters ("input_0", ... if unknown)."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[:count] if len(params) >= count else [f"input_{i}" for i in range(count)]


def owner_module(fn):
    """The Module `fn` is, or is a bound method of; None otherwise."""
    owner = fn if isinstance(fn, Module) else getattr(fn, "__self__", None)
    return owner if isinstance(owner, Module) else None


def module_params(fn):
    """{name: parameter} of the Module `fn` is, or is a bound method of; {} otherwise."""
    owner = owner_module(fn)
    return dict(owner.named_parameters()) if owner is not None else {}


def _output_names(out, recorder):
    """fn's result as a structure of node names: a name, or a tuple of names and Nones."""
    if isinstance(out, Tensor):
        return recorder.name_of(out)
    if isinstance(out, (tuple, list)) and all(o is None or isinstance(o, Tensor) for o in out):
        return tuple(None if o is None else recorder.name_of(o) for o in out)
    raise TypeError(f"trace: fn must return a Tensor or a tuple of Tensors (None allowed), got {type(out).__name__}")


def trace(fn, *example_inputs, params=None):
    """Run `fn(*example_inputs)` once and return a GraphModule of the ops it applied.

    params: {name: tensor} naming the parameters fn reads; by default those of the
    Module fn is (or is a bound method of); other tensors that require grad get
    generated names. Example inputs are Tensors or numpy arrays (token ids, targets).
    """
    if not callable(fn):
        raise TypeError(f"trace: fn must be callable, got {type(fn).__name__}")
    if any(not isinstance(x, (Tensor, np.ndarray)) for x in example_inputs):
        kinds = [type(x).__name__ for x in example_inputs]
        raise TypeError(f"trace: example inputs must be Tensors or numpy arrays, got {kinds}")
    names = input_names(fn, len(example_inputs))
    for x in example_inputs:
        same = [name for name, y in zip(names, example_inputs) if y is x]
        if len(same) > 1:
            raise ValueError(f"trace: the same object is given as inputs {same}; pass a copy for each")
    warn_if_dropout(owner_module(fn))
    recorder = Recorder(dict(zip(names, example_inputs)), params if params is not None else module_params(fn))
    with record_ops(recorder):
        out = fn(*example_inputs)
        structure = _output_names(out, recorder)
    if isinstance(structure, str):
        outputs, layout = (structure,), None
    else:
        outputs = tuple(o for o in structure if o is not None)
        layout = tuple(None if o is None else outputs.index(o) for o in structure)
    graph = Graph(recorder.nodes, outputs).check()
    leaves = {n.name for n in graph.nodes}
    return GraphModule(graph, {k: v for k, v in recorder.params.items() if k in leaves}, layout)

