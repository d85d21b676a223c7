"""Group.all_to_all on the threads backend: uneven splits (Alltoallv), the even default, the
count (bytes = the buffer less the rows a rank keeps) and the errors. Real mpiexec:
tests/parallel/expert_parallel (mpi_scripts/moe_equivalence.py starts with it)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import parallel
from parallel.comm import run_threads


@given(st.integers(1, 4), st.integers(0, 2**16), st.sampled_from([np.float32, np.float64, np.int64]))
def test_every_row_arrives_at_its_rank_in_order(n, seed, dtype):
    splits = np.random.default_rng(seed).integers(0, 3, (n, n))  # splits[r, s]: rows rank r sends rank s

    def exchange():
        group, r = parallel.world(), parallel.world().rank
        rows = np.array([[r, s, j] for s in range(n) for j in range(splits[r, s])], dtype).reshape(-1, 3)
        return group.all_to_all(rows, splits[r], splits[:, r]), group.stats()["all_to_all"], rows.nbytes
    for r, (got, counted, nbytes) in enumerate(run_threads(n, exchange)):
        assert got.tolist() == [[s, r, j] for s in range(n) for j in range(splits[s, r])]
        assert counted["calls"] == 1 and counted["bytes"] == nbytes - splits[r, r] * 3 * np.dtype(dtype).itemsize


def test_without_splits_the_rows_are_split_evenly():
    def exchange():
        r = parallel.world().rank
        return parallel.world().all_to_all(np.arange(6.0).reshape(3, 2) + 10 * r)
    assert [y[:, 0].tolist() for y in run_threads(3, exchange)] == [[0, 10, 20], [2, 12, 22], [4, 14, 24]]


@pytest.mark.parametrize("send, recv, message", [
    ([1, 1], None, "pass both send_splits and recv_splits"),
    ([1, 2], [1, 1], r"send_splits=\[1, 2\] sum to 3, but the buffer has 2 rows"),
    ([2, -0.5], [1, 1], "must be 2 non-negative ints"),
    ([1, 1], [1, 2], "rank 1 sends 1 rows to rank 0, whose recv_splits expect 2"),
])
def test_bad_splits_are_named(send, recv, message):
    def exchange():
        return parallel.world().all_to_all(np.zeros((2, 2)), send, recv if parallel.world().rank == 0 else [1, 1])
    with pytest.raises(ValueError, match=message):
        run_threads(2, exchange)


def test_uneven_rows_without_splits_are_refused():
    with pytest.raises(ValueError, match="3 rows are not divisible by the group size 2"):
        run_threads(2, lambda: parallel.world().all_to_all(np.zeros(3)))
