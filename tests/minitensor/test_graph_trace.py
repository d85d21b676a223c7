"""minitensor.graph.trace and GraphModule: the captured graph runs and differentiates
bitwise as the eager function, and carries names, shapes and costs as data."""
import numpy as np
import pytest
from helpers import leaf
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
from minitensor import graph
from minitensor.graph.graph_module import render_png
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F

# One step of a random program on a (m, k) value: the ops a transformer uses.
STEPS = {
    "matmul": lambda h, w, x: h @ w,
    "linear": lambda h, w, x: F.linear(h, w),
    "gelu": lambda h, w, x: F.gelu(h, approximate="tanh"),
    "tanh": lambda h, w, x: h.tanh(),
    "softmax": lambda h, w, x: F.softmax(h * 0.5),
    "layer_norm": lambda h, w, x: F.layer_norm(h, w[0], w[1]),
    "residual": lambda h, w, x: h + x,
    "scale": lambda h, w, x: h * 3.0 - 1.0,
    "transpose_twice": lambda h, w, x: h.T.T,
    "reshape": lambda h, w, x: h.reshape(-1).reshape(h.shape),
    "slice_concat": lambda h, w, x: mt.concat([h[:, :1], h[:, 1:]], axis=1),
}


def program(steps):
    def fn(x, w):
        h = x
        for step in steps:
            h = STEPS[step](h, w, x)
        return (h * h).sum()
    return fn


@settings(max_examples=15, deadline=None)
@given(steps=st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=6),
       m=st.integers(1, 4), k=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_a_random_program_runs_and_differentiates_bitwise_as_eager(steps, m, k, seed):
    rng = np.random.default_rng(seed)
    x, w = leaf(rng, (m, k)), leaf(rng, (k, k))
    fn = program(steps)
    gm = graph.trace(fn, x, w)
    eager = fn(x, w)
    eager.backward()
    want = [t.grad for t in (x, w)]
    x.grad = w.grad = None
    out = gm(x, w)
    out.backward()
    assert out.data.tobytes() == eager.data.tobytes()
    for t, g in zip((x, w), want):  # w's gradient is None when no step reads it
        assert (t.grad is None and g is None) or t.grad.tobytes() == g.tobytes()


def tiny_gpt(seed, dtype, n_layer=2):
    mt.manual_seed(seed)
    config = GPTConfig(vocab_size=24, block_size=8, n_layer=n_layer, n_head=2, d_model=8)
    return GPT(config, dtype=dtype), config


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), batch=st.integers(1, 3), t=st.integers(1, 8),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_gpt_forward_and_loss_gradients_are_bitwise_the_eager_ones(seed, batch, t, dtype):
    model, config = tiny_gpt(seed, dtype)
    rng = np.random.default_rng(seed)
    idx, targets = (rng.integers(0, config.vocab_size, (batch, t)) for _ in range(2))
    gm = graph.trace(model.forward, idx, targets)
    model.zero_grad()
    logits, loss = model(idx, targets)
    loss.backward()
    want = {name: p.grad.copy() for name, p in model.named_parameters()}
    model.zero_grad()
    # new token ids of the same shape flow through the graph's inputs, not the traced ones
    idx2, targets2 = (rng.integers(0, config.vocab_size, (batch, t)) for _ in range(2))
    assert gm(idx2, targets2)[1].data.tobytes() == model(idx2, targets2)[1].data.tobytes()
    g_logits, g_loss = gm(idx, targets)
    g_loss.backward()
    assert g_logits.data.tobytes() == logits.data.tobytes() and g_loss.data.tobytes() == loss.data.tobytes()
    for name, p in model.named_parameters():
        assert p.grad.tobytes() == want[name].tobytes(), name


def test_the_graph_names_inputs_and_parameters_and_records_ops_as_data():
    model, config = tiny_gpt(0, np.float64, n_layer=1)
    idx = np.zeros((2, 4), dtype=np.int64)
    g = graph.trace(model.forward, idx, idx.copy()).graph
    assert [n.name for n in g.nodes if n.op == "input"] == ["idx", "targets"]
    assert {n.name for n in g.nodes if n.op == "param"} == {name for name, _ in model.named_parameters()}
    linear = g.users("blocks.0.attn.q.weight")[0]
    assert linear.op == "Linear" and linear.inputs == ("layernorm_0", "blocks.0.attn.q.weight", "blocks.0.attn.q.bias")
    assert linear.shape == (2, 4, 8) and linear.dtype == np.float64
    assert linear.flops == 2 * 2 * 4 * 8 * 8
    # x (2·4·8 floats) and W, b read; y written once and once more by the in-place bias add
    assert (linear.bytes_read, linear.bytes_written) == (8 * (64 + 64 + 8 + 64), 8 * (64 + 64))
    softmax = g.of_op("Softmax")[0]
    assert softmax.attrs["axis"] == -1 and softmax.attrs["scale"] == 1 / 2 and softmax.attrs["mask"].shape == (4, 4)
    assert softmax.saved_bytes == softmax.bytes_written  # it keeps its output
    assert dict(g.node("embedding_0").attr_inputs) == {"idx": "idx"}
    assert dict(g.of_op("CrossEntropy")[0].attr_inputs) == {"targets": "targets"}
    assert g.outputs == ("linear_6", "crossentropy_0")  # q, k, v, proj, fc, proj, then lm_head


def test_views_move_no_bytes_and_flops_match_the_eager_table():
    x = mt.tensor(np.ones((3, 4)), requires_grad=True)

    def fn(x):
        return (x * 2.0).exp().reshape(4, 3).T.sum()

    g = graph.trace(fn, x).graph
    ops = [n for n in g.nodes if n.op not in ("input", "param", "constant")]
    assert [(n.op, n.flops) for n in ops] == [(r["op"], r["flops"]) for r in graph.ops_table(fn(x))]
    assert [(n.bytes_read, n.bytes_written) for n in ops if n.op in ("Reshape", "Permute")] == [(0, 0), (0, 0)]
    assert g.node("exp_0").bytes_read == g.node("exp_0").bytes_written == 96


def test_the_graph_reads_the_parameters_current_values():
    rng = np.random.default_rng(0)
    x, w = leaf(rng, (2, 3)), leaf(rng, (3, 3))
    gm = graph.trace(lambda x: (x @ w).sum(), x, params={"w": w})
    assert [n.name for n in gm.graph.nodes if n.op == "param"] == ["w"]
    w.data *= 2.0  # as an optimizer step would (in place)
    assert gm(x).item() == (x @ w).sum().item()


def test_wrong_inputs_are_an_error_naming_them():
    rng = np.random.default_rng(0)
    x = leaf(rng, (2, 3))
    gm = graph.trace(lambda x: x.tanh().sum(), x)
    with pytest.raises(ValueError, match=r"input 'x' was traced with shape \(2, 3\).*got \(3, 3\)"):
        gm(leaf(rng, (3, 3)))
    with pytest.raises(TypeError, match=r"takes 1 inputs \['x'\], got 2"):
        gm(x, x)
    with pytest.raises(ValueError, match=r"the same object is given as inputs \['x', 'y'\]"):
        graph.trace(lambda x, y: x * y, x, x)
    with pytest.raises(TypeError, match="must return a Tensor"):
        graph.trace(lambda x: 3, x)


def test_table_and_dot_show_every_node(tmp_path):
    model, _ = tiny_gpt(0, np.float32, n_layer=1)
    idx = np.zeros((1, 4), dtype=np.int64)
    gm = graph.trace(model.forward, idx, idx.copy())
    table = gm.graph.table()
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["name", "op"] and len(lines) == len(gm.graph.nodes) + 4
    totals = gm.graph.totals()
    assert lines[-1].split()[:3] == ["total", str(totals["nodes"]), "ops"]
    dot = gm.to_dot()
    assert dot.count("shape=box") == totals["nodes"]
    edges = len(gm.graph.edges()) + len(gm.graph.outputs)
    assert ("idx", "embedding_0") in gm.graph.edges() and ("embedding_0", "add_0") in gm.graph.edges()
    assert dot.count("->") == edges and dot.count("style=dashed, label=") == 2  # idx, targets as attributes
    assert "tok_emb.weight, idx=idx" in table
    png = tmp_path / "g.png"
    if not render_png(dot, png):
        pytest.skip("Graphviz's `dot` is not installed: the PNG was not drawn (the DOT text was checked)")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def branchy(x):
    if x.sum().item() > 0:
        return x * 5.0
    return x * -10.0


def branchy_on_a_comparison(x):
    if x.sum() > 0:
        return x * 5.0
    return x * -10.0


def test_a_branch_on_a_traced_value_is_refused_naming_the_line():
    # Left to run, the trace took the branch of x > 0, and the graph then gave −10 where eager gives 5.
    with pytest.raises(graph.TraceError, match=r"test_graph_trace\.py:\d+: `if x\.sum\(\)\.item\(\) > 0:` "
                                               r"asks for item\(\) of a tensor computed from the traced inputs"):
        graph.trace(branchy, mt.tensor([-1.0]))
    w = mt.tensor([1.0], requires_grad=True)  # a parameter decides too: it changes as it trains
    with pytest.raises(graph.TraceError, match=r"asks for numpy\(\)"):
        graph.trace(lambda x: x * float(w.numpy()[0]), mt.tensor([1.0]))
    with pytest.raises(graph.TraceError, match=r"test_graph_trace\.py:\d+: `if x\.sum\(\) > 0:` asks for bool"):
        graph.trace(branchy_on_a_comparison, mt.tensor([1.0]))  # the user's line, not the engine's
    for how, convert in (("bool", bool), ("float", float), ("int", int)):
        with pytest.raises(graph.TraceError, match=rf"x \* convert\(x\.sum\(\)\), mt\.tensor\(\[1\.0\]\)\)` asks for {how}\(\)"):
            graph.trace(lambda x: x * convert(x.sum()), mt.tensor([1.0]))
    positive = graph.trace(lambda x: x * (x.sum() > 0), mt.tensor([1.0]))  # a comparison is an op: traced
    assert positive(mt.tensor([-1.0])).item() == 0.0
    assert branchy(mt.tensor([1.0])).item() == 5.0  # eager reads values as before


def test_values_the_inputs_do_not_decide_are_read_as_usual():
    def fn(x):
        scale = mt.tensor(2.0) * 3.0  # an op on constants only: a constant of the graph
        h = x * scale.item()
        for _ in range(int(mt.tensor(2).item()) + x.shape[0] - len(x)):  # constants, shapes, lengths
            h = h + 1.0
        return h.sum() if len(x) else h
    x = mt.tensor([1.0, 2.0])
    gm = graph.trace(fn, x)
    y = mt.tensor([3.0, -4.0])
    assert gm(y).item() == fn(y).item() == 6 * (3 - 4) + 4


def test_tracing_with_dropout_in_training_mode_warns_and_eval_does_not(recwarn):
    mt.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=24, block_size=8, n_layer=1, n_head=2, d_model=8, dropout=0.1))
    idx = np.zeros((2, 8), dtype=np.int64)
    with pytest.warns(graph.FrozenDropoutWarning, match=r"GPT is in training mode with dropout \(drop, "
                                                        r"blocks\.0\.attn\.resid_drop.*\)(.|\n)*\.eval\(\)"):
        graph.trace(model.forward, idx, idx.copy())
    recwarn.clear()
    graph.trace(model.eval().forward, idx, idx.copy())
    graph.trace(GPT(GPTConfig(vocab_size=24, block_size=8, n_layer=1, n_head=2, d_model=8)).forward, idx, idx.copy())
    assert not [w for w in recwarn if issubclass(w.category, graph.FrozenDropoutWarning)]
