"""The tensor surface on inputs a hostile user tries (issue 50's list): an error naming the value
where PyTorch raises, PyTorch's result where it returns one."""
import numpy as np
import pytest

import minitensor as mt


@pytest.mark.parametrize("call, error, message", [
    (lambda x: x.transpose(0, 5), IndexError, r"transpose: dim 5 is out of range \[-2, 2\) for a tensor of shape"),
    (lambda x: x.swapaxes(-3, 0), IndexError, r"transpose: dim -3 is out of range"),
    (lambda x: x.index_select(1, mt.tensor([-1])), IndexError, r"index_select: index \[-1, -1\] is out of range"),
    (lambda x: x.index_select(0, mt.tensor([2])), IndexError, r"index \[2, 2\] is out of range \[0, 2\) for dim 0"),
])
def test_out_of_range_dims_and_indices_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call(mt.randn(2, 3))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((2, 0), -1), ((0, 3), -1), ((0,), 0)])
def test_softmax_over_an_empty_tensor_is_empty_as_in_pytorch(op, shape, dim):
    x = mt.zeros(*shape, requires_grad=True)
    y = getattr(x, op)(dim)
    y.sum().backward()
    assert y.shape == shape and x.grad.shape == shape


def test_transpose_of_the_same_dim_and_of_a_scalar_are_the_tensor():
    x = mt.randn(2, 3)
    np.testing.assert_array_equal(x.transpose(1, -1).data, x.data)
    assert mt.tensor(3.0).transpose(0, -1).item() == 3.0
