"""F.pad (minitensor.padding): every mode equals numpy's np.pad (constant, reflect, edge, wrap),
negative pads cut as PyTorch's do, the gradient (each output's gradient added back onto the
entry it copies) equals central differences, and bad pads are one-line errors."""
import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from hypothesis import strategies as st
from strategies import pad_cases, seeds

import minitensor as mt
import minitensor.nn.functional as F

NUMPY = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def reference(x, pad, mode, value):
    """np.pad of the (before, after) pairs, cutting first where a pad is negative."""
    pairs = [(0, 0)] * (x.ndim - len(pad) // 2) + [pad[i:i + 2] for i in range(len(pad) - 2, -1, -2)]
    cut = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape, pairs))
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    kwargs = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x[cut], grow, mode=NUMPY[mode], **kwargs)


@given(case=pad_cases(), value=st.sampled_from([0.0, -2.5]), seed=seeds)
def test_pad_against_numpy(case, value, seed):
    shape, pad, mode = case
    x = leaf(np.random.default_rng(seed), shape)
    kwargs = {"value": value} if mode == "constant" else {}
    np.testing.assert_array_equal(F.pad(x, pad, mode, **kwargs).data, reference(x.data, pad, mode, value))
    assert mt.gradcheck(lambda x: F.pad(x, pad, mode, **kwargs), x)


def test_pad_keeps_the_dtype_and_refuses_bad_pads():
    assert F.pad(mt.tensor([1, 2]), (1, 1), value=7).data.tolist() == [7, 1, 2, 7]
    x = mt.ones(2, 3)
    with pytest.raises(ValueError, match="needs an even length of at most 2 × 2"):
        F.pad(x, (1,))
    with pytest.raises(RuntimeError, match="cuts more than the dims"):
        F.pad(x, (-2, -2))
    with pytest.raises(ValueError, match="reflect pad \\(3, 0\\) must be smaller"):
        F.pad(x, (3, 0), "reflect")
    with pytest.raises(ValueError, match="mode must be one of"):
        F.pad(x, (1, 1), "mirror")
    with pytest.raises(ValueError, match="is for mode 'constant'"):
        F.pad(x, (1, 1), "replicate", value=1.0)
