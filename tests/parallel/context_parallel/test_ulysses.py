"""Ulysses (two all-to-alls) on the threads backend: each rank's output and gradients are its
slice of full attention's, the counted traffic equals the formula, and heads that do not
split over cp are a clear error."""
import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st
from strategies import cp_layouts, cp_sizes, seeds

import parallel
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.nn import functional as F
from minitensor.tensor import Tensor
from parallel import HybridGPT, Mesh
from parallel.context_parallel import ContextParallel, all_to_all_elements
from parallel.context_parallel.ulysses import ulysses_attention


@given(cp=cp_sizes, layout=cp_layouts, causal=st.booleans(), heads_per_rank=st.integers(1, 2),
       per_chunk=st.integers(1, 2), seed=seeds)
def test_each_rank_holds_its_slice_of_full_attention_its_gradients_and_the_counted_traffic(
        cp, layout, causal, heads_per_rank, per_chunk, seed):
    seq = (2 * cp if layout == "zigzag" else cp) * per_chunk
    batch, heads, d = 2, cp * heads_per_rank, 3
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((batch, heads, seq, d)) for _ in range(4))
    full = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
    expected = F.scaled_dot_product_attention(*full, causal=causal)
    expected.backward(dout)

    def rank_fn():
        context = ContextParallel(parallel.world(), layout, comm_type="a2a")
        mine = context.indices(seq)
        local = [Tensor(np.ascontiguousarray(a[:, :, mine]), requires_grad=True) for a in (q, k, v)]
        out = ulysses_attention(*local, context, causal)
        out.backward(np.ascontiguousarray(dout[:, :, mine]))
        return mine, [out.data] + [t.grad for t in local], parallel.world().stats().get("send")

    elements = sum(all_to_all_elements(batch, seq, heads * d, cp).values())
    for mine, arrays, sends in parallel.run_threads(cp, rank_fn, timeout=60):
        for name, got, want in zip(("output", "dq", "dk", "dv"), arrays, [expected.data] + [t.grad for t in full]):
            assert_close(got, want[:, :, mine], f"{name} of positions {mine}")
        assert sends == ({"calls": 8 * (cp - 1), "elements": elements, "bytes": 8 * elements} if cp > 1 else None)


def test_heads_that_do_not_split_over_cp_are_an_error_naming_both_numbers():
    config = GPTConfig(vocab_size=7, block_size=16, n_layer=1, n_head=4, d_model=8)
    with pytest.raises(ValueError, match=r"heads per tp rank, 2, divisible by cp = 4"):
        parallel.run_threads(8, lambda: HybridGPT(
            GPT(config).double(), Mesh(tp=2, cp=4), cp_comm_type="a2a"), timeout=30)
