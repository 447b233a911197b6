"""How one worker's slots are shared out among the partitions of the check half.

Why a share: a claim is one script on one partition (one cluster slot), so it can count only
that partition's leases against the slots it may fill. Each partition is given a whole number
of each worker's slots, and the shares of a worker add up to its slots, so however the
partitions fill theirs the worker never runs more than it has. The first partition of a worker's
extra slots is its ``offset`` (a hash of its name), so many small workers spread their slots over
every partition instead of all giving theirs to the first ones.
"""

from __future__ import annotations


def slot_shares(slots: int, partitions: int, offset: int = 0) -> list[int]:
    """Each partition's share of ``slots``: ``slots // partitions`` each, and one more for the
    ``slots % partitions`` partitions from ``offset`` on (wrapping)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    base, extra = divmod(max(0, slots), partitions)
    return [base + (1 if (p - offset) % partitions < extra else 0) for p in range(partitions)]


def take_from_shares(shares: list[int], count: int) -> list[int]:
    """How many of each partition's share ``count`` busy slots (a stuck probe's) take: one at a
    time from the largest share left, so the worker's free slots drop by ``count`` in all and
    no partition gives more than it has."""
    left = list(shares)
    taken = [0] * len(shares)
    for _ in range(min(max(0, count), sum(shares))):
        p = max(range(len(left)), key=lambda i: (left[i], -i))
        left[p] -= 1
        taken[p] += 1
    return taken
