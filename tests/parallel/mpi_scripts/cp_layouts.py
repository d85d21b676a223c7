"""Under mpiexec -n 4 or -n 8: ring attention and `parallel.train --cp N --check` on real ranks
(at -n 4 also Ulysses, --cp-comm-type a2a).

First, ring attention alone over the whole world as one cp group, for both layouts, causal
or not: each rank's output and q, k, v gradients must equal its slice of full attention to
1e-9, its counted K/V sends the formula. Rank 0 prints "ring <layout> causal=<b> ok".
Then the CLI trains two float64 steps per layout given on the command line (dp,tp,pp,cp
with extra switches) and rank 0 compares with one device; it prints
"layout <dp,tp,pp,cp> check <worst difference>".
"""
import sys

import numpy as np

import parallel
from minitensor.nn import functional as F
from minitensor.tensor import Tensor
from parallel.context_parallel import ContextParallel, RingAttention, ring_elements
from parallel.train import main

TINY = ["--steps", "2", "--check", "2", "--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8",
        "--digits", "2", "--log-every", "1"]
LAYOUTS = {  # by world size: (dp, tp, pp, cp), extra switches
    4: [((1, 1, 1, 4), ["--cp-layout", "zigzag"]),
        ((1, 2, 1, 2), ["--cp-layout", "contiguous", "--sequence-parallel", "--microbatches", "2"]),
        ((1, 1, 1, 4), ["--cp-comm-type", "a2a"])],
    8: [((2, 2, 1, 2), ["--microbatches", "2", "--zero"])],
}


def check_ring(world, layout, causal):
    batch, heads, seq, d = 2, 2, 8 * world.size, 4
    rng = np.random.default_rng(5)  # the same arrays on every rank: each takes its own tokens
    q, k, v, dout = (rng.standard_normal((batch, heads, seq, d)) for _ in range(4))
    full = [Tensor(a.copy(), requires_grad=True) for a in (q, k, v)]
    expected = F.scaled_dot_product_attention(*full, causal=causal)
    expected.backward(dout)
    context = ContextParallel(world, layout)
    mine = context.indices(seq)
    local = [Tensor(np.ascontiguousarray(a[:, :, mine]), requires_grad=True) for a in (q, k, v)]
    world.reset_stats()
    out = RingAttention.apply(*local, context=context, causal=causal)
    out.backward(np.ascontiguousarray(dout[:, :, mine]))
    for got, want in zip([out.data] + [t.grad for t in local], [expected.data] + [t.grad for t in full]):
        want = want[:, :, mine]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
    elements = sum(ring_elements(batch, seq, heads * d, world.size).values())
    assert world.stats()["send"]["elements"] == elements, (world.stats(), elements)


world = parallel.world()
for layout in ("zigzag", "contiguous"):
    for causal in (True, False):
        check_ring(world, layout, causal)
        if world.rank == 0:
            print(f"ring {layout} causal={causal} ok", flush=True)
for (dp, tp, pp, cp), extra in LAYOUTS[world.size]:
    result = main(TINY + extra + ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--cp", str(cp)])
    if world.rank == 0:
        assert result["check"] is not None and result["check"] <= 1e-9, result
        print(f"layout {dp},{tp},{pp},{cp} check {result['check']:.1e}", flush=True)
sys.stdout.flush()
