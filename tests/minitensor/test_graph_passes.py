"""minitensor.graph.passes: each rewrite keeps the outputs and every gradient (float64,
to round-off) on random inputs, and it really rewrote the graph (the pattern is gone)."""
import functools
import math

import numpy as np
import pytest
from helpers import assert_close, leaf
from hypothesis import given, settings
from hypothesis import strategies as st

import minitensor as mt
from minitensor import graph
from minitensor.graph import passes
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F

seeds = st.integers(0, 2**16)


def ops(gm):
    return [n.op for n in gm.graph.nodes if n.op not in ("input", "param", "constant")]


def run(gm, inputs, tensors):
    """The outputs and the gradients of `tensors` after backward of the first output's sum."""
    for t in tensors:
        t.grad = None
    outs = gm(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    outs[0].sum().backward()
    return [o.data.copy() for o in outs if o is not None], [t.grad for t in tensors]


def assert_rewrite_keeps_the_function(gm, rewritten, inputs, tensors):
    outs, grads = run(gm, inputs, tensors)
    outs2, grads2 = run(rewritten, inputs, tensors)
    for a, b in zip(outs2, outs):
        assert_close(a, b)
    for a, b in zip(grads2, grads):
        assert (a is None and b is None) or assert_close(a, b) is None


@settings(max_examples=10, deadline=None)
@given(seed=seeds, m=st.integers(1, 4), k=st.integers(1, 4))
def test_dead_node_elimination_drops_what_no_output_reads(seed, m, k):
    rng = np.random.default_rng(seed)
    x, w, unused = leaf(rng, (m, k)), leaf(rng, (k, k)), leaf(rng, (k,))

    def fn(x):
        (x * unused).exp()  # computed, never used
        return (x @ w).tanh()

    gm = graph.trace(fn, x, params={"w": w, "unused": unused})
    dce = gm.transform(passes.eliminate_dead_nodes)
    assert ops(gm) == ["Mul", "Exp", "MatMul", "Tanh"] and ops(dce) == ["MatMul", "Tanh"]
    assert list(dce.params) == ["w"]
    assert_rewrite_keeps_the_function(gm, dce, (x,), (x, w))


@settings(max_examples=10, deadline=None)
@given(seed=seeds, m=st.integers(1, 4), k=st.integers(1, 4))
def test_common_subexpression_elimination_computes_a_repeat_once(seed, m, k):
    rng = np.random.default_rng(seed)
    x, w = leaf(rng, (m, k)), leaf(rng, (k, k))

    def fn(x):
        a = (x @ w).tanh() * 2.0
        b = (x @ w).tanh() * 2.0  # the same three ops (and an equal constant) again
        return a * b + (x @ w).exp()

    gm = graph.trace(fn, x, params={"w": w})
    cse = gm.transform(passes.eliminate_common_subexpressions)
    assert ops(gm).count("MatMul") == 3 and ops(cse) == ["MatMul", "Tanh", "Mul", "Mul", "Exp", "Add"]
    assert sum(n.op == "constant" for n in cse.graph.nodes) == 1
    assert_rewrite_keeps_the_function(gm, cse, (x,), (x, w))


@settings(max_examples=10, deadline=None)
@given(seed=seeds, batch=st.integers(1, 3), m=st.integers(2, 4), k=st.integers(2, 4), n=st.integers(2, 4))
def test_transpose_elimination_merges_permutes_and_turns_a_copied_transposed_product_around(seed, batch, m, k, n):
    rng = np.random.default_rng(seed)
    a, b = leaf(rng, (batch, m, k)), leaf(rng, (batch, k, n))

    def fn(a, b):
        twice = a.transpose(1, 2).transpose(1, 2)                 # xᵀᵀ = x: both go
        moved = a.permute(1, 0, 2).permute(2, 1, 0)               # one permute (axes 2, 0, 1)
        product = (a @ b).transpose(1, 2).reshape(batch, n * m)   # (AB)ᵀ reshaped: a copy
        return (twice * a).sum() + moved.tanh().sum() + (product * product).sum()

    gm = graph.trace(fn, a, b)
    rewritten = gm.transform(passes.eliminate_transposes)
    permutes = [n for n in rewritten.graph.nodes if n.op == "Permute"]
    assert ops(gm).count("Permute") == 5 and len(permutes) == 3  # moved's one, and Bᵀ, Aᵀ
    assert permutes[0].attrs["axes"] == (2, 0, 1)
    reshape = rewritten.graph.of_op("Reshape")[0]
    assert rewritten.graph.node(reshape.inputs[0]).op == "MatMul" and reshape.bytes_written == 0
    assert rewritten.graph.totals()["bytes_moved"] < gm.graph.totals()["bytes_moved"]
    assert_rewrite_keeps_the_function(gm, rewritten, (a, b), (a, b))


def projections(rng, d, widths, bias=True):
    return {f"{name}.{part}": leaf(rng, (w, d) if part == "weight" else (w,))
            for name, w in zip("qkv", widths) for part in (("weight", "bias") if bias else ("weight",))}


@settings(max_examples=10, deadline=None)
@given(seed=seeds, tokens=st.integers(1, 6), d=st.integers(1, 4), widths=st.lists(st.integers(1, 4), min_size=2,
       max_size=3), bias=st.booleans())
def test_qkv_fusion_runs_projections_sharing_an_input_as_one_linear(seed, tokens, d, widths, bias):
    rng = np.random.default_rng(seed)
    x, params = leaf(rng, (2, tokens, d)), projections(rng, d, widths, bias)
    names = "qkv"[:len(widths)]

    def fn(x):
        outs = [F.linear(x, params[f"{p}.weight"], params.get(f"{p}.bias")) for p in names]
        return functools.reduce(lambda a, b: (a.sum(-1, keepdims=True) * b).tanh(), outs)

    gm = graph.trace(fn, x, params=params)
    fused = gm.transform(functools.partial(passes.fuse_qkv, only_if_fewer_bytes=False))
    assert ops(gm).count("Linear") == len(widths) and ops(fused).count("Linear") == 1
    assert ops(fused).count("Concat") == (2 if bias else 1) and ops(fused).count("GetItem") == len(widths)
    assert_rewrite_keeps_the_function(gm, fused, (x,), (x, *params.values()))


def test_qkv_fusion_by_default_only_where_fewer_bytes_move():
    rng = np.random.default_rng(0)
    d = 4
    for tokens, fused in ((3 * d - 2, False), (3 * d + 4, True)):  # fewer bytes once tokens > 3·d
        x, params = leaf(rng, (1, tokens, d)), projections(rng, d, [d] * 3, bias=False)
        gm = graph.trace(lambda x: sum(F.linear(x, params[f"{p}.weight"]) for p in "qkv"), x, params=params)
        rewritten = gm.transform(passes.fuse_qkv)
        assert (ops(rewritten).count("Linear") == 1) == fused, tokens
        assert (rewritten.graph.totals()["bytes_moved"] < gm.graph.totals()["bytes_moved"]) == fused


@pytest.mark.parametrize("form", ["linear", "add", "add_after_exp"])  # every form, every run
@settings(max_examples=5, deadline=None)
@given(seed=seeds, m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4))
def test_bias_gelu_fusion_adds_the_bias_inside_the_gelu_kernel(seed, m, k, n, form):
    rng = np.random.default_rng(seed)
    x, w, b = leaf(rng, (2, m, k)), leaf(rng, (n, k)), leaf(rng, (n,))

    def fn(x):
        if form == "linear":
            return F.gelu(F.linear(x, w, b), approximate="tanh")
        y = x @ w.T
        return F.gelu((y.exp() if form == "add_after_exp" else y) + b, approximate="tanh")

    gm = graph.trace(fn, x, params={"w": w, "b": b})
    fused = gm.transform(passes.fuse_bias_gelu)
    assert "Gelu" in ops(gm) and ops(fused)[-1] == "BiasGelu" and "Gelu" not in ops(fused)
    # in place only into a product's new output: Exp keeps its output for its backward
    assert fused.graph.of_op("BiasGelu")[0].attrs["inplace"] == (form != "add_after_exp")
    assert "Add" not in ops(fused) and all(len(n.inputs) == 2 for n in fused.graph.of_op("Linear"))
    assert fused.graph.totals()["bytes_moved"] < gm.graph.totals()["bytes_moved"]
    assert fused.graph.totals()["flops"] == gm.graph.totals()["flops"]
    assert_rewrite_keeps_the_function(gm, fused, (x,), (x, w, b))


def naive_attention(q, k, v, flip):
    """Attention written op by op: scale, mask (either spelling of where), softmax."""
    d, t = q.shape[-1], q.shape[-2]
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    masked = mt.where(~mask, scores, -np.inf) if flip else mt.masked_fill(scores, mask, -np.inf)
    return F.softmax(masked) @ v


@settings(max_examples=10, deadline=None)
@given(seed=seeds, heads=st.integers(1, 2), t=st.integers(1, 5), d=st.integers(1, 4), flip=st.booleans())
def test_scale_mask_softmax_chain_becomes_one_softmax_that_keeps_only_its_output(seed, heads, t, d, flip):
    rng = np.random.default_rng(seed)
    q, k, v = (leaf(rng, (heads, t, d)) for _ in range(3))
    gm = graph.trace(lambda q, k, v: naive_attention(q, k, v, flip), q, k, v)
    fused = gm.transform(passes.fuse_softmax_chain)
    assert {"Div", "Where"} <= set(ops(gm)) and ops(fused) == ["Permute", "MatMul", "Softmax", "MatMul"]
    softmax = fused.graph.of_op("Softmax")[0]
    assert softmax.attrs["scale"] == 1 / math.sqrt(d) and softmax.attrs["mask"].sum() == t * (t - 1) // 2
    before, after = gm.graph.totals(), fused.graph.totals()
    assert before["saved_bytes"] - after["saved_bytes"] >= 8 * heads * t * t  # the scaled scores
    assert after["flops"] == before["flops"]
    assert_rewrite_keeps_the_function(gm, fused, (q, k, v), (q, k, v))


def test_a_mask_filled_with_a_finite_value_is_not_fused():
    rng = np.random.default_rng(0)
    s = leaf(rng, (3, 3))
    gm = graph.trace(lambda s: F.softmax(mt.masked_fill(s * 0.5, np.eye(3, dtype=bool), -1e9)), s)
    assert ops(gm.transform(passes.fuse_softmax_chain)) == ["Mul", "Where", "Softmax"]  # only exact −∞ is


@settings(max_examples=4, deadline=None)
@given(seed=seeds, batch=st.integers(1, 2), t=st.integers(2, 8))
def test_all_passes_on_a_gpt_keep_its_loss_and_gradients(seed, batch, t):
    mt.manual_seed(seed)
    config = GPTConfig(vocab_size=24, block_size=8, n_layer=2, n_head=2, d_model=8)
    model = GPT(config, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx, targets = (rng.integers(0, config.vocab_size, (batch, t)) for _ in range(2))
    gm = graph.trace(model.forward, idx, targets)
    everything = (passes.eliminate_common_subexpressions, passes.eliminate_transposes,
                  functools.partial(passes.fuse_qkv, only_if_fewer_bytes=False), passes.fuse_bias_gelu,
                  passes.fuse_softmax_chain, passes.eliminate_dead_nodes)
    optimized = gm.transform(*everything)
    assert ops(optimized).count("Linear") == 4 * config.n_layer + 1  # fused qkv, proj, fc, proj; lm_head
    assert ops(optimized).count("BiasGelu") == config.n_layer
    default = gm.transform(*passes.DEFAULT_PASSES)  # no qkv fusion: here tokens ≤ 3·d_model
    assert "Concat" not in ops(default) and default.graph.totals()["nodes"] < gm.graph.totals()["nodes"]
    assert default.graph.totals()["bytes_moved"] < gm.graph.totals()["bytes_moved"]
    params = [p for _, p in model.named_parameters()]
    for rewritten in (optimized, default):
        assert_rewrite_keeps_the_function(gm, rewritten, (idx, targets), params)
