"""`Tensor`: one numpy array, an optional gradient, and the node that produced it."""
import math
import reprlib

import numpy as np

from minitensor import autograd, dtypes, versions
from minitensor.promotion import DEFAULT_FLOAT  # float32, PyTorch's default float dtype

# PyTorch's dtype names; they are numpy's dtypes, so `mt.float32 is np.float32`.
float16, float32, float64, int64 = np.float16, np.float32, np.float64, np.int64


def _as_array(data, dtype=None):
    """numpy arrays and scalars keep their dtype; Python floats become float32, ints int64.

    Anything that is not numbers (a string, objects, ragged lists) is an error naming it.
    """
    if isinstance(data, Tensor):
        data = data.data
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise TypeError(f"tensor: cannot make a tensor of {_describe(data)} ({error})") from None
    if array.dtype.kind not in "biuf" and not dtypes.is_floating(array.dtype):  # bool, int, float, bfloat16
        raise TypeError(f"tensor: needs numbers (bool, int or float), got {_describe(data)} of numpy dtype {array.dtype}")
    if dtype is None and not isinstance(data, (np.ndarray, np.generic)) and array.dtype == np.float64:
        array = array.astype(DEFAULT_FLOAT)
    return array


def _describe(value):
    return f"{type(value).__name__} {reprlib.repr(value)}"


class _Size(int):
    """What `t.size` is: numpy's element count (an int), and, called, PyTorch's
    `t.size()` (the shape) or `t.size(d)` (the length of dim d)."""

    def __new__(cls, shape):
        size = super().__new__(cls, math.prod(shape))
        size.shape = shape
        return size

    def __call__(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def __reduce__(self):  # pickled or copied, it is the plain count
        return int, (int(self),)


class Tensor:
    """A numpy array (`.data`) that can record the ops applied to it.

    `.grad` is a plain numpy array (or None) so that communication code can reduce
    it in place. Only floating-point tensors can require a gradient.
    """

    __array_priority__ = 1000  # `ndarray * Tensor` defers to Tensor.__rmul__
    _grad_slot = None  # where the first gradient of a step goes, if an optimizer's flat layout gave one
    _place = None  # this tensor's place in the graph (autograd.Place), once an op made it
    _version_counter = None  # its versions.Version once a node saved its array or it was written in place

    def __init__(self, data, requires_grad=False):
        self.data = data if isinstance(data, np.ndarray) else _as_array(data)
        self.grad = None
        self._hooks = []
        self.requires_grad = requires_grad

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        if flag and not dtypes.is_floating(self.data.dtype):
            raise TypeError(f"only floating-point tensors can require grad, got dtype {self.data.dtype}")
        self._requires_grad = bool(flag)

    # ---- array facts -------------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: _Size(self.data.shape))  # t.size (numpy) and t.size(), t.size(d) (PyTorch)
    T = property(lambda self: self.transpose())
    is_leaf = property(lambda self: self._node is None)
    _version = property(lambda self: versions.version_of(self).count)  # in-place writes so far (PyTorch's)

    @property
    def _node(self):
        """The node that made this tensor (None for a leaf), kept in its graph place: the
        nodes that read this tensor hold the place, not the tensor (autograd.Place)."""
        return None if self._place is None else self._place._node

    @_node.setter
    def _node(self, node):
        if self._place is not None:
            self._place._node = node
        elif node is not None:
            self._place = autograd.Place(self, node)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({np.array2string(self.data, precision=4, separator=', ')}, dtype={self.dtype}{grad})"

    def numel(self):
        return self.data.size

    def dim(self):
        return self.data.ndim

    def numpy(self):
        autograd.value_read(self, "numpy")  # a trace refuses a value its inputs decide (graph.trace)
        return self.data

    def item(self):
        autograd.value_read(self, "item")
        return self.data.item()

    def detach(self):
        return Tensor(self.data)

    def to(self, dtype):
        """This tensor in `dtype` (differentiable); itself if it already has that dtype, as in PyTorch."""
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"to: expected a dtype such as mt.float32, got {dtype!r} (minitensor has no devices)") from None
        return self if dtype == self.dtype else self.astype(dtype)

    # ---- autograd ----------------------------------------------------------------
    def backward(self, grad=None, retain_graph=False):
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad (no graph behind it)")
        if grad is None:
            if self.size != 1:
                raise RuntimeError(
                    f"backward() without a gradient needs a scalar output; this tensor has shape {self.shape}"
                )
            grad = np.ones_like(self.data)
        grad = np.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=self.dtype)
        if grad.shape != self.shape:
            raise RuntimeError(f"backward(): the gradient given has shape {grad.shape}, but the tensor has shape "
                               f"{self.shape}; pass one of the tensor's shape")
        autograd.run_backward(self, grad, retain_graph=retain_graph)

    def _accumulate_grad(self, grad):
        """Add into `.grad` in place (the first gradient is copied: it may alias others),
        copied into the flat gradient buffer when an optimizer laid one out (flat_params)."""
        if self.grad is None and self._grad_slot is not None:
            self.grad = self._grad_slot
            np.copyto(self.grad, grad)
        elif self.grad is None:
            self.grad = np.array(grad, dtype=self.dtype, copy=True)
        else:
            self.grad += grad
        for hook in self._hooks:
            hook(self)

    def register_post_accumulate_grad_hook(self, hook):
        """Call `hook(tensor)` each time backward has finished accumulating `.grad`."""
        self._hooks.append(hook)
        return _HookHandle(self._hooks, hook)

    # ---- operators: each calls the op of its name, a named method (`x + y` is `x.add(y)`,
    # `2 - x` is `Tensor.sub(2, x)`); `x[i]` and `x[i] = v` are installed with them ----
    def __add__(self, other):
        return self.add(other)

    def __radd__(self, other):
        return Tensor.add(other, self)

    def __sub__(self, other):
        return self.sub(other)

    def __rsub__(self, other):
        return Tensor.sub(other, self)

    def __mul__(self, other):
        return self.mul(other)

    def __rmul__(self, other):
        return Tensor.mul(other, self)

    def __truediv__(self, other):
        return self.div(other)

    def __rtruediv__(self, other):
        return Tensor.div(other, self)

    def __pow__(self, exponent):
        return self.pow(exponent)

    def __neg__(self):
        return self.neg()

    def __matmul__(self, other):
        return self.matmul(other)

    def __rmatmul__(self, other):
        return Tensor.matmul(other, self)

    def __rpow__(self, base):
        return Tensor.pow(base, self)

    def __abs__(self):
        return self.abs()

    # Comparisons and logic give bool tensors without a gradient (minitensor.comparison).
    def __eq__(self, other):
        return self.eq(other) if _is_operand(other) else NotImplemented

    def __ne__(self, other):
        return self.ne(other) if _is_operand(other) else NotImplemented

    def __lt__(self, other):
        return self.lt(other)

    def __le__(self, other):
        return self.le(other)

    def __gt__(self, other):
        return self.gt(other)

    def __ge__(self, other):
        return self.ge(other)

    def __and__(self, other):
        return self.bitwise_and(other)

    __rand__ = __and__

    def __or__(self, other):
        return self.bitwise_or(other)

    __ror__ = __or__

    def __xor__(self, other):
        return self.bitwise_xor(other)

    __rxor__ = __xor__

    def __invert__(self):
        return self.bitwise_not()

    # `==` is elementwise, so a tensor hashes by identity, as in PyTorch: a dict or set of
    # tensors finds each by `is`. (`t in list` compares with ==: use `any(t is x for x in list)`.)
    __hash__ = object.__hash__

    def __bool__(self):
        """The truth of a one-element tensor; any other size is ambiguous, as in PyTorch."""
        if self.data.size != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {self.shape} ({self.data.size} elements) is "
                               f"ambiguous; use .any() or .all()")
        autograd.value_read(self, "bool")
        return bool(self.data.item())

    def __float__(self):
        autograd.value_read(self, "float")
        return float(self.data.item())

    def __int__(self):
        autograd.value_read(self, "int")
        return int(self.data.item())

    # The named methods (sum, max, exp, clamp, reshape, ...) are the op functions themselves,
    # installed from minitensor.methods: a function whose first argument is the tensor.


def _is_operand(value):
    """What `==` compares elementwise: tensors, arrays, numbers, lists (else Python's own ==)."""
    return isinstance(value, (Tensor, np.ndarray, np.generic, bool, int, float, list, tuple))


class _HookHandle:
    def __init__(self, hooks, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def tensor(data, *, dtype=None, requires_grad=False):
    """Make a tensor from numbers, nested lists or a numpy array (copied), like `torch.tensor`.

    numpy arrays keep their dtype and Python floats become float32; to feed a float64
    numpy array to a float32 model, convert it here: `mt.tensor(array, dtype=mt.float32)`.
    """
    return Tensor(np.array(_as_array(data, dtype), copy=True), requires_grad=requires_grad)

