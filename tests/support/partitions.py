"""The check half as beat drives it, for any ``CHECKBEAT_CHECK_PARTITIONS``: one dispatcher per
partition (``beat`` runs one each), ticked together, and a worker's capacity registered in the
partitions the test's checks live in.

Tests that drive the dispatcher in-process use these, so they hold for the suite's
``--check-partitions N`` as for one partition (with one, ``dispatchers`` is a list of one
dispatcher and ``tick_all`` is its tick)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import redis
from celery import Celery

from celery_app.checks.dispatch import Claim, Dispatcher, TickReport
from celery_app.factory import settings_of
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import Keys, partition_of
from celery_app.settings import load_settings


def partitions_of(app: Celery) -> int:
    """How many partitions the app's check half has."""
    return state_keys(settings_of(app)).partitions


def dispatchers(
    app: Celery,
    client: redis.Redis | None = None,
    *,
    publisher=None,
    regions: Sequence[str] | None = None,
) -> list[Dispatcher]:
    """One dispatcher per partition of the app's check half, sharing ``publisher`` (when
    given), as beat runs them."""
    return [
        Dispatcher(app, client=client, publisher=publisher, regions=regions, partition=p)
        for p in range(partitions_of(app))
    ]


@dataclass
class Ticks:
    """What one tick of every partition did: each partition's report, and their claims."""

    reports: list[TickReport] = field(default_factory=list)

    @property
    def claims(self) -> tuple[Claim, ...]:
        return tuple(c for report in self.reports for c in report.claims)

    @property
    def published(self) -> int:
        return sum(report.published for report in self.reports)

    @property
    def reaped(self) -> int:
        return sum(report.reaped for report in self.reports)

    @property
    def promoted(self) -> int:
        return sum(report.promoted for report in self.reports)

    @property
    def rate_limited(self) -> int:
        return sum(report.rate_limited for report in self.reports)

    @property
    def next_due(self) -> float | None:
        due = [report.next_due for report in self.reports if report.next_due is not None]
        return min(due) if due else None


def tick_all(each: Sequence[Dispatcher], now: float | datetime | None = None) -> Ticks:
    """Tick every dispatcher of ``each`` at ``now``, in partition order."""
    return Ticks([d.tick(now) for d in each])


def suite_partitions() -> int:
    """The partition count of the suite's settings (``pytest --check-partitions``), for uids a
    test module names before any fixture runs."""
    return load_settings().check_partitions


def pinned(keys: Keys | int, name: str, partition: int = 0) -> str:
    """A check uid that lives in ``partition`` of ``keys``'s check half (or of one cut in
    ``keys`` partitions): ``name`` itself when it does (always, with one partition), else
    ``name.<k>`` for the smallest k that does.

    For tests about one partition's claim (its order, its slots, its indexes read through
    ``keys``): their checks share the partition, as they share the one check half when there
    is one partition."""
    partitions = keys if isinstance(keys, int) else keys.partitions
    uid, k = name, 0
    while partition_of(uid, partitions) != partition:
        k += 1
        uid = f"{name}.{k}"
    return uid


def suite_keys(prefix: str) -> Keys:
    """The state keys under ``prefix`` with the suite's partition count, for a test module's
    constants (its fixtures' ``keys`` is the same)."""
    return state_keys(load_settings(key_prefix=prefix))


def count_in(client: redis.Redis, keys: Keys, index: Callable[[Keys], str]) -> int:
    """How many members ``index`` (for example ``lambda k: k.due()``) holds, summed over every
    partition of the check half."""
    return sum(client.zcard(index(part)) for part in keys.every_partition())


def members_in(client: redis.Redis, keys: Keys, index: Callable[[Keys], str]) -> set[str]:
    """The members of the set ``index`` (for example ``lambda k: k.checks()``), over every
    partition of the check half."""
    return {m for part in keys.every_partition() for m in client.smembers(index(part))}


def first_partition_names(region: str = "eu") -> tuple[Callable[[str], str], Callable[[str], str]]:
    """(uid, job): the uid of check ``name`` moved to the first partition of the suite's check
    half (:func:`pinned`), and its job in ``region``, for a module whose checks must share the
    partition its ``keys`` and dispatcher read."""
    partitions = suite_partitions()

    def uid(name: str) -> str:
        return pinned(partitions, name)

    def job(name: str) -> str:
        return f"{uid(name)}@{region}"

    return uid, job


def one_partition_only(why: str):
    """Skip a test when the suite runs with partitions (``--check-partitions N`` > 1): for the
    few tests about one partition's internals that cannot hold their assertions otherwise;
    ``why`` says what would change."""
    import pytest

    return pytest.mark.skipif(suite_partitions() > 1, reason=f"one partition only: {why}")


def served_partition(client: redis.Redis, keys: Keys, hostname: str) -> int:
    """The first partition of the check half in which worker ``hostname``'s registration holds
    a share of its slots (a worker with fewer slots than partitions serves only some)."""
    from celery_app.redis.schema import WorkerField

    for part in keys.every_partition():
        if int(client.hget(part.worker(hostname), WorkerField.CONCURRENCY) or 0) > 0:
            return part.partition
    raise AssertionError(f"{hostname} holds no slot in any partition")
