"""Which workers record cron runs: a marker each recording worker keeps fresh in Redis.

Why: a user may adopt checkbeat's beat alone (``beat_scheduler = "beat:CronScheduler"``) while
the workers stay plain Celery workers, which run every message but never record a start or an
end. Without knowing that, a fired window with no recorded start looks lost, an ``overlap=skip``
task looks stuck behind a run in flight, and ``schedule run --wait`` waits for a record that
never comes. A worker that runs :mod:`celery_app.cron_tasks.recording` writes its hostname and
the time into ``Keys.cron_recorders`` when it is ready, every :data:`REFRESH_S` after that and
at its recorded runs; it removes itself at a clean shutdown. A marker older than
:data:`STALE_S` is a worker gone (killed, or long stopped).
"""

from __future__ import annotations

from typing import Any

from celery_app.redis.schema import Keys

#: How often a recording worker refreshes its marker.
REFRESH_S = 30.0
#: A marker older than this is no live recording worker (three refreshes missed).
STALE_S = 3 * REFRESH_S
#: Markers older than this are dropped when a worker writes its own (a host gone for good).
FORGET_S = 86400.0


def mark(client: Any, keys: Keys, worker: str, now: float) -> None:
    """Say that ``worker`` records cron runs (and drop markers of workers gone for a day)."""
    key = keys.cron_recorders()
    stale = [name for name, ts in _read(client, keys).items() if now - ts > FORGET_S]
    pipe = client.pipeline(transaction=False)
    if stale:
        pipe.hdel(key, *stale)
    pipe.hset(key, worker, now)
    pipe.execute()


def forget(client: Any, keys: Keys, worker: str) -> None:
    """A clean shutdown: ``worker`` records nothing any more."""
    client.hdel(keys.cron_recorders(), worker)


def live(client: Any, keys: Keys, now: float) -> list[str]:
    """The recording workers whose marker is fresh (sorted)."""
    return sorted(name for name, ts in _read(client, keys).items() if now - ts <= STALE_S)


def _read(client: Any, keys: Keys) -> dict[str, float]:
    found = {}
    for name, ts in client.hgetall(keys.cron_recorders()).items():
        name = name.decode() if isinstance(name, bytes) else name
        try:
            found[name] = float(ts)
        except ValueError:
            found[name] = 0.0  # a value another version wrote: treated as long gone
    return found


#: What a worker needs to record runs, as the CLI and diagnose say it.
HOW_TO_RECORD = (
    "add 'celery_app.cron_tasks.recording' to the workers' app imports, "
    "or call celery_app.install(app)"
)
