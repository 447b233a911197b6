"""How a worker's slots are shared out among the partitions of the check half
(``scheduling_core.partitions``): every slot given once, every partition served when a worker
has as many slots as there are partitions, a stuck slot taken once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduling_core.partitions import slot_shares, take_from_shares


@given(st.integers(0, 200), st.integers(1, 64), st.integers(0, 1000))
def test_shares_add_up_to_the_slots_and_differ_by_at_most_one(slots, partitions, offset):
    shares = slot_shares(slots, partitions, offset % partitions)
    assert len(shares) == partitions
    assert sum(shares) == slots
    assert max(shares) - min(shares) <= 1
    if slots >= partitions:
        assert min(shares) >= 1  # every partition is served by this worker


def test_the_offset_decides_which_partitions_get_the_extra_slots():
    assert slot_shares(2, 4, 0) == [1, 1, 0, 0]
    assert slot_shares(2, 4, 3) == [1, 0, 0, 1]
    assert slot_shares(9, 4, 1) == [2, 3, 2, 2]
    assert slot_shares(8, 1) == [8]


@given(st.lists(st.integers(0, 20), min_size=1, max_size=16), st.integers(0, 400))
def test_stuck_slots_are_taken_once_and_never_past_a_share(shares, stuck):
    taken = take_from_shares(shares, stuck)
    assert sum(taken) == min(stuck, sum(shares))
    assert all(0 <= t <= s for t, s in zip(taken, shares, strict=True))
