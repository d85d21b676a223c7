"""Ring attention on the threads backend: each rank's output and gradients are its slice of
full attention's; the work each rank counts and the K/V traffic each rank sends equal the
formulas (layout.attention_work, layout.ring_elements)."""
import numpy as np
from helpers import assert_close
from hypothesis import given
from hypothesis import strategies as st
from strategies import ring_attention_cases, seeds

import parallel
from minitensor.nn import functional as F
from minitensor.tensor import Tensor
from parallel.context_parallel import ContextParallel, RingAttention, attention_work, merge_partial, ring_elements
from parallel.context_parallel.ring_attention import block_attention


def full_attention(q, k, v, dout, causal):
    """The single-device attention: output and the gradients of q, k, v."""
    q, k, v = (Tensor(a.copy(), requires_grad=True) for a in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, causal=causal)
    out.backward(dout)
    return out.data, q.grad, k.grad, v.grad


def run_ring(q, k, v, dout, cp, layout, causal, tiles=None):
    """Every rank's (positions, output, dq, dk, dv, counted work, counted sends) of its tokens;
    tiles: flash attention's (B_r, B_c) for each block pair, None: each pair whole."""
    def rank_fn():
        context = ContextParallel(parallel.world(), layout)
        mine = context.indices(q.shape[2])
        local = [Tensor(np.ascontiguousarray(a[:, :, mine]), requires_grad=True) for a in (q, k, v)]
        out = RingAttention.apply(*local, context=context, causal=causal, tiles=tiles)
        out.backward(np.ascontiguousarray(dout[:, :, mine]))
        return mine, out.data, *(t.grad for t in local), context.work, parallel.world().stats().get("send")
    return parallel.run_threads(cp, rank_fn, timeout=60)


@given(case=ring_attention_cases(), seed=seeds, tiles=st.none() | st.tuples(st.integers(1, 4), st.integers(1, 4)))
def test_each_rank_holds_its_slice_of_full_attention_and_its_gradients(case, seed, tiles):
    """Each block pair whole (dense) or in flash attention's tiles, merged by L: the same."""
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal(case["shape"]) for _ in range(4))
    reference = full_attention(q, k, v, dout, case["causal"])
    covered = []
    for mine, *arrays, _, _ in run_ring(q, k, v, dout, case["cp"], case["layout"], case["causal"], tiles):
        for name, got, full in zip(("output", "dq", "dk", "dv"), arrays, reference):
            assert_close(got, full[:, :, mine], f"{name} of positions {mine}")
        covered += list(mine)
    assert sorted(covered) == list(range(case["shape"][2]))  # the ranks hold every token once


@given(case=ring_attention_cases())
def test_counted_work_and_ring_traffic_equal_the_formulas(case):
    (batch, heads, seq, d), cp = case["shape"], case["cp"]
    q = k = v = dout = np.ones(case["shape"])
    for rank, (*_, work, sends) in enumerate(run_ring(q, k, v, dout, cp, case["layout"], case["causal"])):
        assert work == batch * heads * attention_work(seq, rank, cp, case["layout"], case["causal"])
        expected = ring_elements(batch, seq, heads * d, cp)  # forward + backward, K and V of all heads
        elements = expected["forward"] + expected["backward"]
        calls = 2 * (cp - 1) * 2 + (2 * cp if cp > 1 else 0)
        assert sends == ({"calls": calls, "elements": elements, "bytes": 8 * elements} if cp > 1 else None)


def test_zigzag_balances_the_causal_work_the_contiguous_split_does_not():
    # Contiguous rank r: r whole blocks of c = T/cp plus the diagonal's c(c+1)/2 pairs, so
    # the last rank does (2cp-1)/cp times the mean for long sequences (1.875 at cp = 8).
    seq, cp = 64, 8
    c = seq // cp
    contiguous = [attention_work(seq, r, cp, "contiguous") for r in range(cp)]
    assert contiguous == [r * c * c + c * (c + 1) // 2 for r in range(cp)]
    assert sum(contiguous) == seq * (seq + 1) // 2  # the causal triangle, split without overlap
    zigzag = [attention_work(seq, r, cp, "zigzag") for r in range(cp)]
    assert len(set(zigzag)) == 1 and sum(zigzag) == seq * (seq + 1) // 2
    long = [attention_work(2**14, r, cp, "contiguous") for r in range(cp)]
    assert abs(max(long) / np.mean(long) - (2 * cp - 1) / cp) < 1e-3


def test_the_log_sum_exp_merge_of_two_blocks_is_softmax_over_both():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4)) * 30, rng.standard_normal((6, 4)) * 30, rng.standard_normal((6, 2))
    out, lse = block_attention(q, k[:2], v[:2], 1.0, False)
    block_out, block_lse = block_attention(q, k[2:], v[2:], 1.0, False)
    merge_partial(out, lse, block_out, block_lse)
    scores = q @ k.T  # scores up to ~±3000: exp() overflows unless every exponent is a difference
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    assert_close(out, weights / weights.sum(axis=1, keepdims=True) @ v, "merged output")
    assert_close(lse, np.log(weights.sum(axis=1)) + scores.max(axis=1), "merged log-sum-exp")


def test_each_block_is_passed_on_before_it_is_computed(monkeypatch):
    # Overlap: when a block is computed, its sends to the next rank are already under way.
    # The real group counts the isends: at step i (one block per step here) a rank has issued
    # 2(i+1) of them (K and V per step), except at the last step, which passes nothing on.
    import parallel.context_parallel.ring_attention as ring_attention
    seen = {}
    compute = ring_attention.block_attention

    def recording(*args):
        world = parallel.world()
        seen.setdefault(world.rank, []).append(world.stats().get("send", {"calls": 0})["calls"])
        return compute(*args)
    monkeypatch.setattr(ring_attention, "block_attention", recording)
    cp = 3
    ones = np.ones((1, 1, 6, 2))
    run_ring(ones, ones, ones, ones, cp, "contiguous", causal=False)
    assert seen == {rank: [2, 4, 4] for rank in range(cp)}  # sent after computing would read [0, 2, 4]
