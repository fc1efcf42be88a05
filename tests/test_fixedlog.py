"""The fixed-point logarithm the encoder's estimates use (wdelta.policy.fixedlog): the
same integers for every input form, within its stated error of log2, monotone."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from wdelta.policy import fixedlog


def lg_int(x: int) -> int:
    """fixedlog.lg of one Python integer, from its exact bit length (the array form
    guesses the leading bit through a float)."""
    e = x.bit_length() - 1
    top = (x << (63 - e)) >> (63 - fixedlog.INDEX_BITS)
    return e * fixedlog.ONE + int(fixedlog.table()[top & ((1 << fixedlog.INDEX_BITS) - 1)])


def test_the_table_is_the_rounded_down_fractions() -> None:
    table = fixedlog.table().tolist()
    assert len(table) == 1 << fixedlog.INDEX_BITS and table[0] == 0
    for i, entry in enumerate(table):
        exact = math.log2(1 + i / (1 << fixedlog.INDEX_BITS)) * fixedlog.ONE
        assert entry == math.floor(exact), i
    assert all(a < b for a, b in itertools.pairwise(table))


def test_log2_of_ln2_is_rounded_down() -> None:
    assert math.floor(math.log2(math.log(2)) * fixedlog.ONE) == fixedlog.LG_LN2


@given(st.lists(st.integers(1, 2**63 - 1), min_size=1, max_size=50))
def test_array_and_integer_forms_agree_and_stay_within_the_error(xs: list[int]) -> None:
    # Also above 2^53, where the array form's float guess of the leading bit can be
    # one too high and must be corrected.
    found = fixedlog.lg(np.array(xs, dtype=np.uint64)).tolist()
    assert found == [lg_int(x) for x in xs]
    for x, value in zip(xs, found, strict=True):
        e = x.bit_length() - 1
        exact = e + math.log2(x / 2**e)  # log2 without float overflow of x
        assert exact - 0.0015 <= value / fixedlog.ONE <= exact + 1e-9


def test_powers_of_two_and_their_neighbours() -> None:
    for e in range(63):
        x = 1 << e
        assert lg_int(x) == e * fixedlog.ONE
        if e:
            assert lg_int(x - 1) < e * fixedlog.ONE
    xs = np.array([2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1], dtype=np.uint64)
    assert fixedlog.lg(xs).tolist() == [lg_int(int(x)) for x in xs]


@given(st.integers(1, 2**62), st.integers(1, 2**62))
def test_monotone(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert lg_int(lo) <= lg_int(hi)
