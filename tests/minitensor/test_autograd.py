"""The backward walk and its contracts: depth, seeds, grad mode, graph release,
accumulation, hooks, dtypes and error messages."""
import threading

import numpy as np
import pytest
from helpers import leaf
from hypothesis import given
from strategies import seeds, small_shapes

import minitensor as mt
from minitensor.nn import functional as F


def test_a_10000_op_chain_backpropagates_without_recursion():
    x = mt.tensor(np.array([0.5]), requires_grad=True)
    y = x
    for i in range(5000):  # 10,000 ops: y ← (y · 1.0001) + i
        y = y * 1.0001 + float(i)
    y.backward(np.array([1.0]))
    np.testing.assert_allclose(x.grad, [1.0001**5000], rtol=1e-12)


@given(shape=small_shapes, seed=seeds)
def test_backward_with_an_explicit_gradient_of_any_shape(shape, seed):
    rng = np.random.default_rng(seed)
    x = leaf(rng, shape)
    grad = rng.standard_normal(shape)
    (x * 3.0).backward(grad)
    np.testing.assert_allclose(x.grad, 3 * grad, rtol=1e-15)


def test_backward_without_gradient_needs_a_scalar_and_checks_the_gradient_shape():
    x = mt.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"scalar.*\(2, 3\)"):
        (x * 2.0).backward()
    with pytest.raises(RuntimeError, match=r"\(3, 2\).*\(2, 3\)"):
        (x * 2.0).backward(np.ones((3, 2)))
    with pytest.raises(RuntimeError, match="does not require grad"):
        mt.tensor(np.ones(1)).backward()


def test_no_grad_as_context_manager_and_decorator():
    x = mt.tensor(np.ones(2), requires_grad=True)
    with mt.no_grad():
        assert not (x * 2.0).requires_grad and (x * 2.0)._node is None
        with mt.enable_grad():
            assert (x * 2.0).requires_grad
        assert not mt.is_grad_enabled()
    assert mt.is_grad_enabled()

    @mt.no_grad()
    def doubled(t, depth):
        return doubled(t, depth - 1) if depth else t * 2.0

    assert not doubled(x, 3).requires_grad
    assert mt.is_grad_enabled()  # a recursive decorated call restores grad mode on the way out
    assert (x * 2.0).requires_grad


def test_no_grad_is_thread_local_even_through_one_decorated_function():
    both_inside, results = threading.Barrier(2), {}

    @mt.no_grad()
    def wait_inside():
        both_inside.wait()  # both threads are inside the same decorated function now
        both_inside.wait()

    def quiet_thread():
        with mt.no_grad():
            wait_inside()
            results["quiet"] = mt.is_grad_enabled()

    def loud_thread():
        wait_inside()
        results["loud"] = mt.is_grad_enabled()

    def other_thread():
        both_inside.wait()
        results["other"] = mt.is_grad_enabled()
        both_inside.wait()

    for pair in ((quiet_thread, loud_thread), (loud_thread, other_thread)):
        threads = [threading.Thread(target=f) for f in pair]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {"quiet": False, "loud": True, "other": True}
    assert mt.is_grad_enabled()


def test_requires_grad_propagates_and_detach_cuts():
    a = mt.tensor(np.ones(2), requires_grad=True)
    c = mt.tensor(np.ones(2))
    assert (a + c).requires_grad and (c * a).requires_grad and not (c * c).requires_grad
    assert not (c * c).requires_grad and (c * c).is_leaf
    d = (a * 2.0).detach()
    assert not d.requires_grad and d.is_leaf


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="int64"):
        mt.tensor([1, 2], requires_grad=True)
    t = mt.tensor([1, 2])
    with pytest.raises(TypeError, match="floating"):
        t.requires_grad = True


def test_second_backward_through_a_released_graph_is_an_error():
    x = mt.tensor(np.array([2.0]), requires_grad=True)
    y = (x * x).exp()
    y.backward(np.ones(1))
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward(np.ones(1))
    z = y * 3.0  # a new graph on top of the released one
    with pytest.raises(RuntimeError, match="released"):
        z.backward(np.ones(1))


def test_retain_graph_allows_a_second_backward_and_gradients_accumulate_in_place():
    x = mt.tensor(np.array([2.0, -1.0]), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    first = x.grad
    np.testing.assert_array_equal(first, [4.0, -2.0])
    y.backward()
    assert x.grad is first  # same buffer, added into
    np.testing.assert_array_equal(first, [8.0, -4.0])


def test_first_gradient_is_a_copy_not_an_alias():
    x = mt.tensor(np.ones(3), requires_grad=True)
    grad = np.ones(3)
    x.backward(grad)
    x.grad += 1
    np.testing.assert_array_equal(grad, 1)


def test_post_accumulate_hook_fires_once_per_backward_with_the_final_gradient():
    x = mt.tensor(np.array([1.0, 2.0]), requires_grad=True)
    seen = []
    handle = x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.copy()))
    loss = (x * x).sum() + (x * 3.0).sum() + x.sum()  # three paths into x
    loss.backward()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], 2 * x.data + 4)
    (x * 1.0).sum().backward()
    assert len(seen) == 2
    np.testing.assert_array_equal(seen[1], 2 * x.data + 5)  # accumulated
    handle.remove()
    x.sum().backward()
    assert len(seen) == 2


def test_float32_stays_float32_with_python_and_numpy_scalars():
    x = mt.tensor(np.array([[1.0, 2.0]], dtype=np.float32), requires_grad=True)
    outs = [x * 2.0, 2.0 * x, x + 1, 1 - x, x / 3.0, 3.0 / x, x**2, x ** np.float64(2.5), -x, x.mean(),
            x.sum() * x, x * np.float64(0.5), mt.tensor([[1, 2]]) * x, x.exp().log().sqrt().tanh(),
            F.gelu(x), F.softmax(x), F.dropout(x, 0.5), F.layer_norm(x, mt.tensor(np.ones(2, np.float32)),
                                                                     mt.tensor(np.zeros(2, np.float32)))]
    for out in outs:
        assert out.dtype == np.float32, out
        out.backward(np.ones(out.shape, np.float32))
        assert x.grad.dtype == np.float32
    assert mt.tensor(1.5).dtype == np.float32


def test_float64_is_preserved_end_to_end():
    from minitensor.models import GPT, GPTConfig

    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, d_model=4)).double()
    logits, loss = model(np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))
    assert logits.dtype == np.float64 and loss.dtype == np.float64
    loss.backward()
    assert all(p.grad.dtype == np.float64 for p in model.parameters())
    x = leaf(np.random.default_rng(0), (2, 3))
    for out in (x.sum(), x.max(), x.mean(), x.sum() * x):  # full reductions return numpy scalars
        assert out.dtype == np.float64


def test_mixed_float_dtypes_are_a_clear_error():
    a32 = mt.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    a64 = mt.tensor(np.ones((2, 2)), requires_grad=True)
    cases = [lambda: a32 + a64, lambda: a32 * np.ones((2, 2)), lambda: a32 @ a64, lambda: mt.concat([a32, a64]),
             lambda: mt.where(np.ones((2, 2), bool), a32, a64), lambda: F.linear(a32, a64),
             lambda: F.layer_norm(a32, a64[0], a64[1])]
    for case in cases:
        with pytest.raises(TypeError, match="float32.*float64|float64.*float32"):
            case()


def test_shape_mismatch_messages_name_both_shapes_and_the_op():
    a, b = mt.tensor(np.ones((2, 3))), mt.tensor(np.ones((4, 5)))
    cases = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b,
             "matmul": lambda: a @ b, "linear": lambda: F.linear(a, b), "concat": lambda: mt.concat([a, b], axis=1),
             "where": lambda: mt.where(np.ones((2, 3), bool), a, b), "stack": lambda: mt.stack([a, b]),
             "layer_norm": lambda: F.layer_norm(a, b[0], b[0])}
    for op, case in cases.items():
        with pytest.raises(ValueError) as info:
            case()
        message = str(info.value)
        assert op in message and ("(2, 3)" in message or "(3,)" in message), message
        assert "(4, 5)" in message or "(5,)" in message, message
    with pytest.raises(ValueError, match=r"reshape.*\(2, 3\).*\(4, 2\)"):
        a.reshape(4, 2)


def test_a_backward_returning_the_wrong_shape_is_named():
    class Bad(mt.Function):
        def forward(self, a):
            return a * 2

        def backward(self, grad):
            return grad.sum(axis=0)

    x = mt.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Bad.*\(3,\).*\(2, 3\)"):
        Bad.apply(x).backward(np.ones((2, 3)))


def test_astype_is_differentiable_and_returns_the_gradient_in_the_input_dtype():
    x = mt.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = (x * 2.0).astype(np.float64)
    assert y.dtype == np.float64 and not y.is_leaf
    (y * mt.tensor(np.array([3.0, 4.0]))).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, [6.0, 8.0])


def test_parameter_gradients_become_final_in_reverse_layer_order():
    """Data parallelism overlaps its all-reduces with backward only if each layer's
    gradients are final as soon as backward has passed that layer, not at the end."""
    from minitensor.models import GPT, GPTConfig

    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, d_model=16))
    fired = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda t, name=name: fired.append(name))
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    model(idx, idx)[1].backward()

    def first_seen(prefix):
        return min(i for i, name in enumerate(fired) if name.startswith(prefix))

    assert fired[0] == "lm_head.weight"
    assert first_seen("ln_f") < first_seen("blocks.2") < first_seen("blocks.1") < first_seen("blocks.0")
    assert first_seen("blocks.0") < first_seen("tok_emb")


def test_backward_with_a_gradient_of_the_wrong_shape_names_both_shapes():
    """It used to read 'backward().backward returned a gradient ...', as if a node had failed."""
    x = mt.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^backward\(\): the gradient given has shape \(3, 2\), "
                                           r"but the tensor has shape \(2, 3\)"):
        (x * 2).backward(np.ones((3, 2)))
    assert x.grad is None


def test_a_tensor_of_anything_but_numbers_is_a_clear_error():
    """mt.tensor('hello') used to make a tensor of dtype <U5, and an object array one of dtype object."""
    cases = [("hello", r"tensor: needs numbers .*str 'hello'"),
             (np.array([object()]), r"tensor: needs numbers .*ndarray.*dtype object"),
             ([[1.0, 2.0], [3.0]], r"tensor: cannot make a tensor of list \[\[1\.0, 2\.0\], \[3\.0\]\]"),
             ({"a": 1}, r"tensor: needs numbers .*dict")]
    for data, message in cases:
        with pytest.raises(TypeError, match=message):
            mt.tensor(data)
    with pytest.raises(TypeError, match=r"tensor: cannot make a tensor of str 'hello'"):
        mt.tensor("hello", dtype=mt.float32)
    assert mt.tensor([True, False]).dtype == np.bool_ and mt.tensor(np.uint8(3)).dtype == np.uint8


def test_saved_tensors_hooks_pack_what_backward_saves_and_unpack_it_in_backward():
    from minitensor.autograd import saved_tensors_hooks

    w = mt.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), requires_grad=True)
    x = mt.tensor(np.array([[1.0, -1.0]]), requires_grad=True)
    packed, unpacked = [], []

    def pack(array):
        packed.append(array.shape)
        return ("ref", array.copy())  # the graph keeps whatever pack returns

    def unpack(saved):
        unpacked.append(saved[1].shape)
        return saved[1]

    with saved_tensors_hooks(pack, unpack):
        y = (x @ w).sum()
    assert packed == [(1, 2), (2, 2)] and unpacked == []  # matmul saved both operands, packed
    w.data = np.full((2, 2), np.nan)  # the graph does not hold w's array: only what pack returned
    y.backward()
    assert unpacked == [(1, 2), (2, 2)]
    np.testing.assert_array_equal(x.grad, [[3.0, 7.0]])  # dx = 1·wᵀ of the values packed
    np.testing.assert_array_equal(w.grad, [[1.0, 1.0], [-1.0, -1.0]])
    z = (x * 2).sum()  # outside the block nothing is packed
    z.backward()
    assert len(packed) == 2
