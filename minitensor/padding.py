"""`F.pad`: a tensor widened (or, by negative amounts, cut) at the ends of its last dims,
as `torch.nn.functional.pad(x, pad, mode, value)`.

`pad` lists (before, after) pairs from the LAST dim backwards: `(1, 2)` pads the last dim
with 1 in front and 2 behind, `(1, 2, 0, 3)` also the dim before it with 3 behind. The
modes say what the new entries are: 'constant' (`value`), 'reflect' (mirrored without the
edge: 2 1 | 0 1 2 | 1 0), 'replicate' (the edge repeated), 'circular' (wrapped around).

Every mode is one map: each output entry is a copy of one input entry, or the constant.
Padding an array of the input's flat positions with the same mode writes that map out
(`source`: −1 for a constant entry), so one Function serves all four: forward reads
x at the sources, backward adds each output's gradient back onto its source.
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.errors import ShapeError
from minitensor.tensor import Tensor

NUMPY_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


class Pad(Function):
    """y[p] = x.flat[source[p]], or the constant where source[p] = −1.
    dx.flat[i] = Σ_{p: source[p] = i} dy[p] (an entry copied twice gets both gradients)."""

    def forward(self, x, source, value):
        self.source, self.shape = source, x.shape
        y = x.reshape(-1)[np.maximum(source, 0)] if x.size else np.zeros(source.shape, x.dtype)
        y[source < 0] = value
        return y

    def backward(self, grad):
        dx = np.zeros(int(np.prod(self.shape)), grad.dtype)
        copied = self.source >= 0
        np.add.at(dx, self.source[copied], grad[copied])
        return dx.reshape(self.shape)


def _pairs(op, pad, shape, mode):
    """The (before, after) of every dim of `shape`, from PyTorch's flat last-dim-first list."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) > 2 * len(shape):
        raise ShapeError(f"{op}: pad {pad} needs an even length of at most 2 × {len(shape)} (the dims of {shape})")
    pairs = [(0, 0)] * (len(shape) - len(pad) // 2) + [pad[i:i + 2] for i in range(len(pad) - 2, -1, -2)]
    for n, (before, after) in zip(shape, pairs):
        if n + before + after < 0 or (mode != "constant" and min(before, after) < 0):
            raise ShapeError(f"{op}: pad {pad} cuts more than the dims of {shape} hold "
                             f"(only 'constant' mode may cut)")
        if mode == "reflect" and max(before, after) >= n and max(before, after):
            raise ShapeError(f"{op}: reflect pad {pad} must be smaller than the dims it pads in {shape}")
        if mode == "circular" and max(before, after) > n:
            raise ShapeError(f"{op}: circular pad {pad} must be at most the dims it pads in {shape}")
    return pairs


def source_map(shape, pairs, mode):
    """For each output entry, the flat position of the input entry it copies (−1: the constant)."""
    positions = np.arange(int(np.prod(shape))).reshape(shape)
    cut = tuple(slice(max(-before, 0), n - max(-after, 0)) for n, (before, after) in zip(shape, pairs))
    grow = [(max(before, 0), max(after, 0)) for before, after in pairs]
    kwargs = {"constant_values": -1} if mode == "constant" else {}
    return np.pad(positions[cut], grow, mode=NUMPY_MODES[mode], **kwargs)


def pad(input, pad, mode="constant", value=None):
    """`input` padded by `pad` ((before, after) pairs from the last dim back) in `mode`:
    'constant' (with `value`, default 0), 'reflect', 'replicate' or 'circular'."""
    input = input if isinstance(input, Tensor) else Tensor(input)
    if mode not in NUMPY_MODES:
        raise ValueError(f"pad: mode must be one of {list(NUMPY_MODES)}, got {mode!r}")
    if value is not None and mode != "constant":
        raise ValueError(f"pad: value={value} is for mode 'constant', not {mode!r}")
    pairs = _pairs("pad", pad, input.shape, mode)
    return Pad.apply(input, source=source_map(input.shape, pairs, mode), value=0 if value is None else value)
