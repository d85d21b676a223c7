"""Mesh: the rank layout, its sub-groups for every small layout, the picture and the bad-mesh error."""
import itertools

import numpy as np
import pytest

import parallel
from parallel.mesh import rank_of

LAYOUTS = [(dp, tp, pp) for dp, tp, pp in itertools.product(range(1, 9), repeat=3) if dp * tp * pp <= 8]


@pytest.mark.parametrize("dp, tp, pp", LAYOUTS)
def test_coordinates_and_group_members(dp, tp, pp):
    def rank_fn():
        mesh = parallel.Mesh(dp=dp, tp=tp, pp=pp)
        members = {axis: list(getattr(mesh, f"{axis}_group").all_gather(np.array([mesh.world.rank])))
                   for axis in ("dp", "tp", "pp")}
        ranks = {axis: getattr(mesh, f"{axis}_group").rank for axis in ("dp", "tp", "pp")}
        return mesh.coords, members, ranks
    results = parallel.run_threads(dp * tp * pp, rank_fn, timeout=20)
    for rank, (coords, members, ranks) in enumerate(results):
        d, t, p, c = coords
        assert c == 0  # cp = 1: the 3-D layout unchanged
        assert rank == p * dp * tp + d * tp + t == rank_of(d, t, p, dp, tp)
        assert members == {"tp": [rank_of(d, i, p, dp, tp) for i in range(tp)],
                           "dp": [rank_of(i, t, p, dp, tp) for i in range(dp)],
                           "pp": [rank_of(d, t, i, dp, tp) for i in range(pp)]}
        assert ranks == {"dp": d, "tp": t, "pp": p}
    assert sorted(coords[:3] for coords, _, _ in results) == sorted(
        itertools.product(range(dp), range(tp), range(pp)))


def test_describe_draws_one_block_per_stage_rows_dp_columns_tp():
    pictures = parallel.run_threads(8, lambda: parallel.Mesh(dp=2, tp=2, pp=2).describe(), timeout=20)
    assert pictures[6] == "\n".join([
        "mesh dp=2 x tp=2 x pp=2 over 8 ranks (tp fastest, then dp, then pp)",
        "pp stage 0",
        "      tp0 tp1",
        "  dp0   0   1",
        "  dp1   2   3",
        "pp stage 1",
        "      tp0 tp1",
        "  dp0   4   5",
        "  dp1   6   7",
        "this is rank 6: dp 1, tp 0, pp 1",
    ])


def test_a_mesh_on_the_one_rank_world():
    mesh = parallel.Mesh()
    assert (mesh.coords, mesh.dp_group.size, mesh.tp_group.size, mesh.pp_group.size) == ((0, 0, 0, 0), 1, 1, 1)


@pytest.mark.parametrize("dp, tp, pp, size", [(2, 2, 2, 6), (1, 3, 1, 2), (4, 1, 1, 8)])
def test_a_mesh_that_does_not_fit_the_world_fails_on_every_rank(dp, tp, pp, size):
    def rank_fn():
        with pytest.raises(ValueError) as info:
            parallel.Mesh(dp=dp, tp=tp, pp=pp)
        assert parallel.world().stats() == {}  # raised before any communication
        return str(info.value)
    expected = f"Mesh: dp={dp} x tp={tp} x pp={pp} = {dp * tp * pp} ranks, but the world has {size}"
    assert parallel.run_threads(size, rank_fn, timeout=20) == [expected] * size


@pytest.mark.parametrize("kwargs, pattern", [({"dp": 0}, "dp=0"), ({"tp": 1.5}, "tp=1.5")])
def test_mesh_sizes_must_be_positive_ints(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        parallel.Mesh(**kwargs)


CP_LAYOUTS = [(dp, tp, pp, cp) for dp, tp, pp, cp in itertools.product((1, 2), (1, 2), (1, 2), (2, 3, 4))
              if dp * tp * pp * cp <= 8]


@pytest.mark.parametrize("dp, tp, pp, cp", CP_LAYOUTS)
def test_four_axes_tp_fastest_then_cp_then_dp_then_pp(dp, tp, pp, cp):
    axes = ("dp", "tp", "pp", "cp", "dp_cp")

    def rank_fn():
        mesh = parallel.Mesh(dp, tp, pp, cp)
        members = {axis: list(getattr(mesh, f"{axis}_group").all_gather(np.array([mesh.world.rank])))
                   for axis in axes}
        return mesh.coords, members
    results = parallel.run_threads(dp * tp * pp * cp, rank_fn, timeout=20)
    for rank, (coords, members) in enumerate(results):
        d, t, p, c = coords
        assert rank == ((p * dp + d) * cp + c) * tp + t == rank_of(d, t, p, dp, tp, c, cp)
        assert members == {"tp": [rank_of(d, i, p, dp, tp, c, cp) for i in range(tp)],
                           "cp": [rank_of(d, t, p, dp, tp, i, cp) for i in range(cp)],
                           "dp": [rank_of(i, t, p, dp, tp, c, cp) for i in range(dp)],
                           "pp": [rank_of(d, t, i, dp, tp, c, cp) for i in range(pp)],
                           "dp_cp": [rank_of(i, t, p, dp, tp, j, cp) for i in range(dp) for j in range(cp)]}
    assert sorted(coords for coords, _ in results) == sorted(
        (d, t, p, c) for d, t, p, c in itertools.product(range(dp), range(tp), range(pp), range(cp)))


def test_describe_draws_cp_blocks_of_tp_columns():
    pictures = parallel.run_threads(8, lambda: parallel.Mesh(dp=2, tp=2, pp=1, cp=2).describe(), timeout=20)
    assert pictures[6] == "\n".join([
        "mesh dp=2 x tp=2 x pp=1 x cp=2 over 8 ranks (tp fastest, then cp, then dp, then pp)",
        "pp stage 0",
        "      cp0.tp0 cp0.tp1 cp1.tp0 cp1.tp1",
        "  dp0       0       1       2       3",
        "  dp1       4       5       6       7",
        "this is rank 6: dp 1, tp 0, pp 0, cp 1",
    ])


def test_a_4d_mesh_that_does_not_fit_the_world_names_cp():
    with pytest.raises(ValueError, match=r"dp=1 x tp=2 x pp=1 x cp=2 = 4 ranks, but the world has 2"):
        parallel.run_threads(2, lambda: parallel.Mesh(1, 2, 1, 2), timeout=20)
