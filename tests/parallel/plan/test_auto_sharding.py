"""Layouts over a tp group and the collective (and α–β seconds) that turns one into another."""
import pytest

from parallel.alpha_beta import all_gather, ring_all_reduce
from parallel.plan.auto import PARTIAL, REPLICATED, collective, layouts_of, split
from parallel.plan.auto.sharding import gradient_layout, join, reshard_seconds

R, P, S0, S1 = REPLICATED, PARTIAL, split(0), split(1)


def test_layouts_split_only_the_dimensions_tp_divides():
    assert layouts_of((4, 6), 2) == [R, P, S0, S1]
    assert layouts_of((4, 6), 3) == [R, P, S1]
    assert layouts_of((), 2) == [R, P]


@pytest.mark.parametrize("source, target, expected", [
    (P, R, "all-reduce"), (P, S1, "reduce-scatter"), (S0, R, "all-gather"), (S0, S1, "all-to-all"),
    (R, S0, None), (R, P, None), (S1, P, None), (S1, S1, None), (P, P, None),
])
def test_the_collective_between_two_layouts(source, target, expected):
    assert collective(source, target) == expected


def test_reshard_seconds_are_the_planners_alpha_beta_formulas():
    n, nbytes, alpha, beta = 4, 4096, 1e-6, 1e-9
    assert reshard_seconds(P, R, nbytes, n, alpha, beta) == ring_all_reduce(n, nbytes, alpha, beta)
    assert reshard_seconds(P, S0, nbytes, n, alpha, beta) == all_gather(n, nbytes, alpha, beta)
    assert reshard_seconds(S0, R, nbytes, n, alpha, beta) == all_gather(n, nbytes, alpha, beta)
    # all-to-all: each rank keeps 1/n of its slice and sends n − 1 pieces of N/n² bytes
    assert reshard_seconds(S0, S1, nbytes, n, alpha, beta) == pytest.approx(3 * (alpha + nbytes / 16 * beta))
    assert reshard_seconds(R, S0, nbytes, n, alpha, beta) == 0
    assert reshard_seconds(P, R, nbytes, 1, alpha, beta) == 0      # one rank: nothing to move


def test_gradients_of_whole_values_are_whole_and_contributions_join_to_partial():
    assert [gradient_layout(layout) for layout in (R, P, S1)] == [R, R, S1]
    assert join(None, S0) == S0 and join(S0, S0) == S0 and join(R, R) == R
    assert join(R, S0) == P and join(S0, S1) == P and join(P, R) == P
