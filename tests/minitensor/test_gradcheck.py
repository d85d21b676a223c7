"""gradcheck must catch a backward that is wrong by only 0.1%, and pass a correct one."""
import numpy as np
import pytest

import minitensor as mt


class ScaledSquare(mt.Function):
    """y = a²·b, with a backward for `a` that can be scaled away from the truth."""

    factor = 1.0

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * a * b

    def backward(self, grad):
        a, b = self.saved
        return self.factor * 2 * a * b * grad, a * a * grad


class WrongByOneTenthPercent(ScaledSquare):
    factor = 1.001


def inputs():
    rng = np.random.default_rng(0)
    return (mt.tensor(rng.uniform(0.5, 2.0, (3, 4)), requires_grad=True),
            mt.tensor(rng.uniform(0.5, 2.0, (3, 4)), requires_grad=True))


def test_a_correct_backward_passes():
    assert mt.gradcheck(ScaledSquare.apply, *inputs()) is True


def test_a_backward_off_by_a_tenth_of_a_percent_is_caught_and_reported():
    with pytest.raises(AssertionError, match=r"input 0, element \(\d, \d\): analytic .* numeric .* error"):
        mt.gradcheck(WrongByOneTenthPercent.apply, *inputs())


def test_only_inputs_that_require_grad_are_checked():
    a, b = inputs()
    a.requires_grad = False
    assert mt.gradcheck(WrongByOneTenthPercent.apply, a, b)  # the wrong part is never asked for


def test_a_backward_that_confuses_output_positions_is_caught():
    class Flipped(mt.Function):  # right for an all-ones upstream gradient, wrong otherwise
        def forward(self, a):
            return 2 * a

        def backward(self, grad):
            return 2 * grad[::-1]

    with pytest.raises(AssertionError, match="input 0"):
        mt.gradcheck(Flipped.apply, mt.tensor(np.arange(4.0), requires_grad=True))


def test_gradcheck_leaves_inputs_and_their_gradients_unchanged():
    a, b = inputs()
    data, grad = a.data.copy(), np.full(a.shape, 7.0)
    a.grad = grad
    mt.gradcheck(ScaledSquare.apply, a, b)
    np.testing.assert_array_equal(a.data, data)
    assert a.grad is grad and b.grad is None


def test_gradcheck_needs_float64_inputs():
    with pytest.raises(TypeError, match="float32"):
        mt.gradcheck(lambda x: x * 2.0, mt.tensor(np.ones(2, np.float32), requires_grad=True))
