"""The partition count the check half in Redis was built with, and the refusal to run with
another.

Why a guard: a check lives in the partition its uid hashes to among ``CHECKBEAT_CHECK_PARTITIONS``
(``Keys.of_check``), so a beat, worker or command given another count looks for every check in
the wrong place: beat would dispatch nothing and report nothing wrong. The count is recorded
(``Keys.check_layout``) by the first process that finds the check half empty, and changed by
``checks reconcile``, which moves the checks (``checks/repartition.py``); a store from before
it was recorded holds one partition.
"""

from __future__ import annotations

from typing import Any

from celery_app.errors import CheckbeatError
from celery_app.redis.schema import Keys

SETTING = "CHECKBEAT_CHECK_PARTITIONS"


class PartitionLayoutError(CheckbeatError, RuntimeError):
    """The partition count setting differs from the one the check half was built with."""

    field = SETTING


def stored_partitions(client: Any, keys: Keys) -> int | None:
    """The partition count recorded for the check half; None when none is recorded."""
    raw = client.get(keys.check_layout())
    return int(raw) if raw is not None else None


def holds_checks(client: Any, keys: Keys) -> bool:
    """Whether any partition of ``keys``' layout lists a check."""
    pipe = client.pipeline(transaction=False)
    for part in keys.every_partition():
        pipe.scard(part.checks())
    return any(pipe.execute())


def ensure_layout(client: Any, keys: Keys, *, record: bool = True) -> None:
    """Record ``keys.partitions`` for an empty check half, or check it against the one
    recorded; :class:`PartitionLayoutError` (naming the setting and both counts) when they
    differ. ``record`` False (a command, which writes nothing it was not asked to): only
    check."""
    stored = stored_partitions(client, keys)
    if stored != keys.partitions:
        built = Keys(keys.prefix, keys.cluster, partitions=stored or 1)
        if not holds_checks(client, built):  # empty: take this count
            if record:
                client.set(keys.check_layout(), keys.partitions)
            return
        stored = stored or 1
    if stored != keys.partitions:
        raise PartitionLayoutError(
            f"{SETTING}={keys.partitions}, but the checks in Redis are stored in {stored} "
            f"partition(s): set it back to {stored}, or stop beats and workers and run "
            "`celery -A <app> checks reconcile` with the new count to move them"
        )
