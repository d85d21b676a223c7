"""Reverse-mode automatic differentiation: the `Function` node and the backward walk.

Every differentiable op is a small subclass of `Function` whose `forward` (numpy in,
numpy out) and `backward` (gradient of the output in, one gradient per input out)
sit side by side. `Function.apply` runs `forward` and, when any input requires a
gradient, links the output tensor to the node that made it. `backward` walks those
links in reverse topological order, iteratively, so a graph of any depth works.
"""
import contextlib
import math
import threading

from minitensor import dtypes, speed, versions


class _ThreadState(threading.local):
    """What autograd keeps per thread (grad mode is per thread, as in PyTorch). The class
    attributes are every thread's starting values, read as plain attributes: `apply`
    reads them for every op."""

    grad_enabled = True
    tracer = None  # record_ops' callback while it records
    saved_hooks = ()  # saved_tensors_hooks' (pack, unpack) pairs, the innermost last


_state = _ThreadState()


def is_grad_enabled():
    return _state.grad_enabled


class no_grad(contextlib.ContextDecorator):
    """Context manager and decorator: ops inside record no graph."""

    def _recreate_cm(self):
        # A decorator makes a fresh manager per call, so recursive calls and threads
        # sharing one decorated function each restore their own previous mode.
        return type(self)()

    def __enter__(self):
        self._previous = is_grad_enabled()
        _state.grad_enabled = False

    def __exit__(self, *exc):
        _state.grad_enabled = self._previous
        return False


class enable_grad(no_grad):
    """Context manager and decorator: record the graph even inside `no_grad`."""

    def __enter__(self):
        self._previous = is_grad_enabled()
        _state.grad_enabled = True


class saved_tensors_hooks:
    """Context manager (PyTorch's `torch.autograd.graph.saved_tensors_hooks`): every array a
    Function saves for backward inside the block is kept as `pack(array)`, and backward
    reads `unpack(packed)` instead. Fully sharded data parallelism uses it so the graph
    holds a reference to a parameter's place, not its values: the parameters can be freed
    after forward and gathered again when backward reads them."""

    def __init__(self, pack, unpack):
        self.hooks = (pack, unpack)

    def __enter__(self):
        _state.saved_hooks += (self.hooks,)

    def __exit__(self, *exc):
        _state.saved_hooks = _state.saved_hooks[:-1]
        return False


class record_ops:
    """Context manager: every `Function.apply` in this thread inside the block also calls
    `callback(cls, inputs, params, node, result)` (minitensor.graph.trace builds its graph
    from these calls), and a tensor whose value goes to Python (`item()`, `numpy()`,
    `bool()`, ...) calls `callback.value_read(tensor, how)` if the callback has one (the
    tracer refuses a value its inputs decide). Ops run exactly as without it."""

    def __init__(self, callback):
        self.callback = callback

    def __enter__(self):
        if _state.tracer is not None:
            raise RuntimeError("record_ops: already recording in this thread (a trace inside a trace)")
        _state.tracer = self.callback

    def __exit__(self, *exc):
        _state.tracer = None
        return False


def value_read(tensor, how):
    """`tensor`'s value is going to Python by `how` ("item", "numpy", "bool", ...): tell this
    thread's recorder, if one is recording and listens (record_ops)."""
    tracer = _state.tracer
    if tracer is not None and hasattr(tracer, "value_read"):
        tracer.value_read(tensor, how)


def recording():
    return _state.tracer is not None


def rebound(tensor, source):
    """`tensor` now holds `source`'s value (an in-place op, `x[i] = v`): tell this thread's recorder,
    if one is recording (graph.trace names `tensor` by `source`'s node from here on)."""
    if _state.tracer is not None and hasattr(_state.tracer, "rebound"):
        _state.tracer.rebound(tensor, source)


class PackedSaved:
    """A node's saved arrays as the pack hook left them; reading one unpacks it."""

    def __init__(self, arrays, hooks):
        pack, self.unpack = hooks
        self.packed = tuple(pack(a) for a in arrays)

    def __len__(self):
        return len(self.packed)

    def __getitem__(self, index):
        return self.unpack(self.packed[index])

    def __iter__(self):
        return (self.unpack(p) for p in self.packed)


class Function:
    """One node of the graph. Subclasses define `forward` and `backward`.

    `forward(*arrays, **params)` computes the output from numpy arrays and keeps what
    backward needs with `self.save_for_backward(...)` (or plain attributes for
    non-array values). `backward(grad)` returns one gradient per tensor input
    (a single array when there is one input; None where no gradient flows). A Function
    whose output is not floating (comparison.Discrete) is recorded by traces but never
    linked for backward.
    """

    def save_for_backward(self, *arrays):
        hooks = _state.saved_hooks
        self.saved = PackedSaved(arrays, hooks[-1]) if hooks else arrays

    @classmethod
    def apply(cls, *inputs, **params):
        from minitensor.tensor import Tensor

        node = cls()
        out = node.forward(*[t.data for t in inputs], **params)
        # an integer or bool output (a comparison, an argmax) has no gradient, as in PyTorch
        needs_grad = is_grad_enabled() and any(t.requires_grad for t in inputs) and (
            out.dtype.kind == "f" or dtypes.is_floating(out.dtype))
        result = Tensor(out, requires_grad=needs_grad)
        if _state.tracer is not None:  # minitensor.graph.trace is recording this thread's ops
            _state.tracer(cls, inputs, params, node, result)
        if needs_grad:
            node.inputs = graph_inputs(inputs)
            node.versions = versions.record(node, (*inputs, result))  # backward checks them (versions.check)
            result._place = Place(result, node)  # a fresh tensor: its place, made by this node
        else:
            node.saved = ()
        return result

    def forward(self, *arrays, **params):
        raise NotImplementedError

    def backward(self, grad):
        raise NotImplementedError

    @property
    def name(self):
        return type(self).__name__


class Place:
    """A tensor's place in the graph without its values: what a node holds of an input
    that another node made, when the speed switch `free_unsaved_activations` is on.

    The backward walk needs of an input only its producer, shape, dtype and whether it
    requires grad; its values only where a backward saved them (then the node keeps them
    in `saved`). A node that held the Tensor itself kept every activation alive until
    backward, saved or not: the input of each Add, the attention scores before the
    softmax, the heads before they are merged, which PyTorch frees as soon as forward
    moves on. Measured on the medium bench GPT (tracemalloc, numpy arrays): alive after
    forward 242 → 182 MiB, peak of the step 277 → 207 MiB.

    The tensor reads its producer here (Tensor._node), so releasing it through either
    releases it for both; every node reading one tensor holds the same place, so the walk
    meets it once."""

    __slots__ = ("_node", "shape", "dtype", "requires_grad")

    def __init__(self, tensor, node):
        self._node, self.shape, self.dtype, self.requires_grad = node, tensor.shape, tensor.dtype, tensor.requires_grad

    size = property(lambda self: math.prod(self.shape))
    ndim = property(lambda self: len(self.shape))


def graph_inputs(inputs):
    """What a node holds of its inputs: a leaf itself (backward accumulates into it), a
    tensor an op made by its Place (or itself with the switch off)."""
    if not speed.enabled("free_unsaved_activations"):
        return inputs
    return tuple(t if t._place is None else t._place for t in inputs)


class _Released:
    """Stands in for a node whose saved activations were freed by `backward()`."""

    name = "<released>"


RELEASED = _Released()


def topological_order(root):
    """Tensors that `root` depends on (through nodes that need grad), inputs first.

    Iterative depth-first search: a node is emitted after all of its inputs, and the
    explicit stack means a 10,000-op chain never touches Python's recursion limit.
    """
    order, expanded = [], set()
    stack = [(root, False)]
    while stack:
        tensor, inputs_done = stack.pop()
        if inputs_done:
            order.append(tensor)
            continue
        if id(tensor) in expanded:
            continue
        expanded.add(id(tensor))
        stack.append((tensor, True))
        node = tensor._node
        if node is RELEASED:
            raise RuntimeError(
                "backward() through a graph that was already released: its saved "
                "activations were freed by an earlier backward(). Call backward("
                "retain_graph=True) the first time if you need to go through it twice."
            )
        if node is not None:
            # Leaves go on the stack first, so they are popped (and emitted) after the
            # node's other inputs: in reverse order each leaf then comes right after its
            # consumers, and its gradient is final early in backward (where data
            # parallelism starts reducing it), not at the very end.
            inputs = sorted(node.inputs, key=lambda t: t._node is not None)
            stack.extend((t, False) for t in inputs if t.requires_grad and id(t) not in expanded)
    return order


def check_grad(tensor, grad, node_name):
    """The one place where every gradient's shape and dtype are checked against its
    tensor's (a float64 gradient for a float32 tensor is a silent upcast somewhere)."""
    if grad.shape != tensor.shape or grad.dtype != tensor.dtype:
        raise RuntimeError(
            f"{node_name}.backward returned a gradient of shape {grad.shape} and dtype {grad.dtype} "
            f"for an input of shape {tensor.shape} and dtype {tensor.dtype}"
        )


def node_gradients(node, grad):
    """`node.backward(grad)` as a tuple: one gradient (or None) per input."""
    input_grads = node.backward(grad)
    return input_grads if isinstance(input_grads, tuple) else (input_grads,)


def run_backward(root, grad, retain_graph=False, weights=None):
    """Propagate `grad` from `root` to every leaf that requires grad.

    Gradients of intermediate tensors live in a dict only while needed; a leaf's
    gradient is accumulated into `.grad` in place when the walk reaches it, which is
    after every consumer has contributed, so its post-accumulate hooks see the final
    value (data parallelism starts communicating there).

    With `weights` (a `split_backward.WeightGradients`) the walk is the B half of a
    split backward: each node is asked only for the gradients that flow on towards
    the chosen inputs, and `weights` keeps the weight part for its later W call.
    """
    pending = {id(root): grad}
    for tensor in reversed(topological_order(root)):
        grad = pending.pop(id(tensor), None)
        if grad is None:
            continue
        node = tensor._node
        if node is None:
            tensor._accumulate_grad(grad)
            continue
        versions.check(node)
        input_grads = node_gradients(node, grad) if weights is None else weights.split(node, grad)
        for inp, g in zip(node.inputs, input_grads):
            if g is None or not inp.requires_grad:
                continue
            check_grad(inp, g, node.name)
            pending[id(inp)] = g if id(inp) not in pending else pending[id(inp)] + g
        if not retain_graph:
            tensor._node = RELEASED
