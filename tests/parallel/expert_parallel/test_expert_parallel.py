"""Expert parallelism equals one device: hypothesis over (dp, ep, tp, pp, cp, schedule, ZeRO stage,
recomputation, E, k, renormalise, capacity, micro-batches) on the threads backend, and fixed
layouts under real mpiexec."""
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_launch import requires_mpiexec, run_mpi
from mpi_scripts.moe_common import batches, expert_parallel, moe_config, single_device, worst_difference

import parallel
from minitensor import tensor
from minitensor.models.gpt import GPT
from minitensor.nn.moe import balancing_loss
from parallel.comm import run_threads
from parallel.expert_parallel import AllToAllDispatcher
from parallel.hybrid import HybridGPT
from parallel.mesh import Mesh

SCRIPTS = Path(__file__).parents[1] / "mpi_scripts"


@st.composite
def moe_layouts(draw):
    """A mixture-of-experts layout of at most 4 ranks: dp × ep, with tp, pp or cp beside them, any ZeRO stage;
    with ep > 1, sometimes device-limited routing (a token's experts on at most M of the ep ranks)."""
    ep = draw(st.sampled_from([1, 2, 4]))
    dp = ep * draw(st.sampled_from([1, 2] if ep < 4 else [1]))
    tp, pp, cp = draw(st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)] if dp <= 2 else [(1, 1, 1)]))
    n_experts = ep * draw(st.integers(1, 2))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "zb-h1"])) if pp > 1 else "1f1b"
    capacities = [None] if cp > 1 else [None, 0.5, 1.0, 1.5]  # a capacity under cp is refused (dropless only)
    top_k = draw(st.integers(1, min(2, n_experts)))
    limit = draw(st.integers(1, ep)) if ep > 1 and draw(st.booleans()) else None
    if limit and (limit * (n_experts // ep) < top_k or -(-top_k // limit) > n_experts // ep):
        limit = None
    return dict(dp=dp, ep=ep, tp=tp, pp=pp, cp=cp, n_experts=n_experts, top_k=top_k,
                expert_groups=ep if limit else 1, max_groups_per_token=limit,
                renormalize=draw(st.booleans()), capacity_factor=draw(st.sampled_from(capacities)),
                microbatches=draw(st.sampled_from([1, 2])), moe_every=draw(st.sampled_from([1, 2])),
                schedule=schedule, recompute_activations=draw(st.booleans()), zero=draw(st.sampled_from([0, 1, 2, 3])))


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(2, 5), st.integers(0, 2**16))
def test_the_balancing_loss_split_over_ranks_is_the_whole_groups(ranks, groups, share, n_experts, seed):
    """Each of `groups` token groups (a sequence under cp, a micro-batch under dp × cp) lies in equal
    shares over the ranks: their mean of the loss, and of its gradient, is one device's (float64)."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(n_experts), size=(groups, ranks, share))  # group, rank, token of the rank's share
    experts = rng.integers(0, n_experts, (groups, ranks, share, 2))

    def local_loss(rank):
        mine = tensor(probs[:, rank].reshape(-1, n_experts), requires_grad=True)
        loss = balancing_loss(mine, experts[:, rank].reshape(-1, 2), groups, 0.3, parallel.world())
        loss.backward()
        return loss.item(), mine.grad.reshape(groups, share, n_experts)

    results = run_threads(ranks, lambda: local_loss(parallel.world().rank))
    whole = tensor(probs.reshape(-1, n_experts), requires_grad=True)
    want = balancing_loss(whole, experts.reshape(-1, 2), groups, 0.3)
    want.backward()
    assert np.mean([loss for loss, _ in results]) == pytest.approx(want.item(), rel=1e-12)
    grads = np.stack([grad for _, grad in results], axis=1) / ranks  # d(mean over ranks)/d(probs), by (group, rank)
    np.testing.assert_allclose(grads.reshape(-1, n_experts), whole.grad, rtol=1e-12)


@given(moe_layouts())
def test_every_layout_equals_one_device_over_several_adamw_steps(layout):
    dp, ep, tp, pp, cp, m = (layout.pop(axis) for axis in ("dp", "ep", "tp", "pp", "cp", "microbatches"))
    switches = {name: layout.pop(name) for name in ("schedule", "recompute_activations", "zero")}
    config, data = moe_config(**layout), batches(3, batch=2 * dp * m)
    reference = single_device(config, data)
    results = run_threads(dp * tp * pp * cp,
                          lambda: expert_parallel(config, data, None, dp, ep, m, tp=tp, pp=pp, cp=cp, **switches))
    for result in results:
        assert worst_difference(reference, result) < 1e-9


def test_each_rank_holds_its_experts_under_their_single_device_names():
    config = moe_config(n_experts=4, top_k=2)

    def names():
        gpt = GPT(config, dtype=np.float64)
        dense = [name for name, _ in gpt.named_parameters()]
        model = HybridGPT(gpt, Mesh(4, ep=2))
        mine = [name for name, _ in model.named_parameters()]
        assert mine == [name for name in dense if name in mine]  # the dense order, experts left out
        assert [n for n in mine if ".experts." not in n] == [n for n in dense if ".experts." not in n]
        assert all(isinstance(layer.dispatcher, AllToAllDispatcher) for layer in model.moe_layers())
        return [name for name in mine if ".experts." in name and name.endswith("fc.weight")]
    ranks = run_threads(4, names)
    assert ranks[0] == ranks[2] == [f"blocks.{b}.mlp.experts.{e}.fc.weight" for b in (0, 1) for e in (0, 1)]
    assert ranks[1] == ranks[3] == [f"blocks.{b}.mlp.experts.{e}.fc.weight" for b in (0, 1) for e in (2, 3)]


def test_the_expert_gradients_are_reduced_over_the_expert_replicas_only():
    config, data = moe_config(n_experts=2, top_k=1), batches(1, batch=8)

    def stats():
        model = HybridGPT(GPT(config, dtype=np.float64), Mesh(4, ep=2))
        model.train_step(*data[0])
        model.reset_communication_stats()
        model.finish_grad_sync()
        return model.communication_stats(), model.replicas.reducers[-1].group.size
    (counted, edp), *_ = run_threads(4, stats)
    assert edp == 2 and set(counted) == {("dp", "all_reduce"), ("edp", "all_reduce")}


def test_bad_expert_layouts_are_refused():
    with pytest.raises(ValueError, match="ep=3 must divide dp=4"):
        run_threads(4, lambda: Mesh(4, ep=3))
    with pytest.raises(ValueError, match="n_experts=3 is not divisible by ep=2"):
        run_threads(2, lambda: HybridGPT(GPT(moe_config(3, 1), dtype=np.float64), Mesh(2, ep=2)))
    with pytest.raises(ValueError, match="under sequence parallelism"):
        run_threads(2, lambda: HybridGPT(GPT(moe_config(2, 1), dtype=np.float64), Mesh(tp=2), sequence_parallel=True))


@requires_mpiexec
@pytest.mark.parametrize("dp, tp, pp, ep, zero", [(2, 1, 1, 2, 0), (2, 2, 1, 2, 0), (2, 1, 2, 2, 1)])
def test_expert_parallel_equals_one_device_on_real_ranks(dp, tp, pp, ep, zero):
    n = dp * tp * pp
    result = run_mpi(n, [SCRIPTS / "moe_equivalence.py", *map(str, (dp, tp, pp, ep, zero))], timeout=240)
    assert sorted(re.findall(r"rank \d+ ok", result.stdout)) == [f"rank {r} ok" for r in range(n)]
