"""The ragged gathers of parallel.comm.gather, over a real threads group."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import seeds

import parallel
from parallel import run_threads
from parallel.comm.gather import all_gather_json, all_gather_ragged, gather_named_arrays


@given(n=st.integers(1, 4), seed=seeds)
def test_gather_named_arrays_merges_disjoint_parts_of_mixed_dtypes_and_shapes(n, seed):
    rng = np.random.default_rng(seed)
    parts = [{f"r{r}.{k}": rng.standard_normal(rng.integers(0, 3, size=rng.integers(0, 3))).astype(dtype)
              for k, dtype in enumerate(rng.choice(["float32", "float64", "int64"], size=rng.integers(0, 3)))}
             for r in range(n)]
    expected = {name: a for part in parts for name, a in part.items()}
    for merged in run_threads(n, lambda: gather_named_arrays(parallel.world(), parts[parallel.world().rank])):
        assert list(merged) == list(expected)
        for name, a in expected.items():
            assert merged[name].dtype == a.dtype
            np.testing.assert_array_equal(merged[name], a)


def test_gather_named_arrays_rejects_a_name_held_twice():
    with pytest.raises(ValueError, match="'w' is held by ranks 0 and 1"):
        run_threads(2, lambda: gather_named_arrays(parallel.world(), {"w": np.zeros(2)}))


@given(n=st.integers(1, 4), seed=seeds)
def test_all_gather_ragged_returns_every_ranks_array_whatever_its_length(n, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(rng.integers(0, 5)) for _ in range(n)]
    for got in run_threads(n, lambda: all_gather_ragged(parallel.world(), arrays[parallel.world().rank])):
        assert len(got) == n
        for a, b in zip(got, arrays):
            np.testing.assert_array_equal(a, b)


def test_all_gather_json_returns_every_ranks_value():
    values = [{"rank": 0, "name": "ü"}, [1, 2.5, None], "x" * 1000]
    assert run_threads(3, lambda: all_gather_json(parallel.world(), values[parallel.world().rank])) == [values] * 3
