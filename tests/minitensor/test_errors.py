"""The engine's errors (minitensor.errors) are both the Python class a reader expects and the
class PyTorch raises for the same misuse, so `except ValueError` and code written against
PyTorch (`except RuntimeError`, `except IndexError`) both catch them, with one line naming
the values."""
import numpy as np
import pytest

import minitensor as mt
import minitensor.nn.functional as F

x, y = mt.ones(2, 3), mt.ones(4, 5)

# misuse: (what PyTorch raises, what the engine raised before and still is, the message)
MISUSES = {
    "broadcast": (lambda: x + y, RuntimeError, ValueError, "shapes \\(2, 3\\) and \\(4, 5\\) cannot be broadcast"),
    "matmul": (lambda: x @ x, RuntimeError, ValueError, "matmul: shapes \\(2, 3\\) and \\(2, 3\\) do not fit"),
    "reshape": (lambda: x.reshape(4), RuntimeError, ValueError, "cannot reshape \\(2, 3\\) \\(6 elements\\)"),
    "cat": (lambda: mt.cat([x, y]), RuntimeError, ValueError, "differ outside dim 0"),
    "stack": (lambda: mt.stack([x, y]), RuntimeError, ValueError, "stack: shapes"),
    "split": (lambda: x.split([1, 1], dim=1), RuntimeError, ValueError, "do not add up to 3"),
    "where": (lambda: mt.where(np.ones(5, bool), x, x), RuntimeError, ValueError, "condition \\(5,\\)"),
    "float mix": (lambda: x + mt.ones(2, 3, dtype=mt.float64), RuntimeError, TypeError, "dtypes"),
    "bitwise float": (lambda: x & x, RuntimeError, TypeError, "bitwise_and: needs bool or integer"),
    "gather range": (lambda: x.gather(1, mt.tensor([[3]])), RuntimeError, IndexError, "out of range"),
    "gather dims": (lambda: x.gather(1, mt.tensor([0])), RuntimeError, ValueError, "same number of dims"),
    "dim": (lambda: x.sum(5), IndexError, IndexError, "5 is out of range"),
    "index": (lambda: x[5], IndexError, IndexError, "out of bounds"),
}


@pytest.mark.parametrize("misuse", sorted(MISUSES))
def test_each_misuse_raises_pytorchs_class_and_the_engines(misuse):
    action, pytorch_class, engine_class, message = MISUSES[misuse]
    with pytest.raises(pytorch_class, match=message) as raised:
        action()
    assert isinstance(raised.value, engine_class)
    assert "\n" not in str(raised.value)


def test_losses_refuse_targets_in_one_line():
    with pytest.raises(ValueError, match="needs targets of shape"):
        F.cross_entropy(mt.ones(2, 3), mt.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="label_smoothing must be in \\[0, 1\\], got 1.5"):  # probabilities too
        F.cross_entropy(mt.ones(2, 3), mt.ones(2, 3) / 3, label_smoothing=1.5)
