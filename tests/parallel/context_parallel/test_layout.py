"""The cp layouts: which positions each rank holds, and the clear error for a sequence they cannot cut."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import cp_layouts, cp_sizes

from parallel.context_parallel import check_sequence_length, token_positions


def test_the_zigzag_and_contiguous_pictures():
    # T = 8, cp = 2: contiguous 0 0 0 0 1 1 1 1, zigzag 0 0 1 1 1 1 0 0 (the layout.py docstring)
    assert [list(token_positions(8, r, 2, "contiguous")) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(token_positions(8, r, 2, "zigzag")) for r in range(2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]


@given(cp=cp_sizes, layout=cp_layouts, per_chunk=st.integers(1, 4))
def test_the_ranks_hold_every_position_once_in_equal_shares(cp, layout, per_chunk):
    seq = (2 * cp if layout == "zigzag" else cp) * per_chunk
    held = [token_positions(seq, r, cp, layout) for r in range(cp)]
    assert all(len(h) == seq // cp for h in held)
    assert sorted(np.concatenate(held)) == list(range(seq))
    if layout == "zigzag":  # rank r: chunks r and 2cp-1-r
        for r, h in enumerate(held):
            assert h[0] == r * per_chunk and h[-1] == (2 * cp - r) * per_chunk - 1


@pytest.mark.parametrize("seq, cp, layout, message", [
    (6, 2, "zigzag", "sequence length 6 is not divisible by 2·cp = 4"),
    (12, 4, "zigzag", "sequence length 12 is not divisible by 2·cp = 8"),
    (7, 2, "contiguous", "sequence length 7 is not divisible by cp = 2"),
])
def test_a_sequence_the_layout_cannot_cut_names_both_numbers(seq, cp, layout, message):
    with pytest.raises(ValueError, match=message):
        check_sequence_length(seq, cp, layout)


def test_an_unknown_layout_is_named():
    with pytest.raises(ValueError, match="layout 'striped' is not one of"):
        check_sequence_length(8, 2, "striped")
