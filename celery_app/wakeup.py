"""Wake the dispatcher the moment a worker frees a slot.

Why: the dispatcher only publishes what free slots can start now, so a slot that frees between
two ticks stays idle until the next tick. For 50 ms probes on a 0.25 s tick that idle time is
most of the slot's capacity (the overload bench measured it). The worker's post-exec pushes one
element per completed run; the dispatcher's loop waits on the list with its tick as timeout
and ticks as soon as anything arrives. The list is trimmed to one element: it is a doorbell, not
a queue, and many rings before a tick mean one tick.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from celery_app.keys import Keys

#: Seconds a ring survives with no dispatcher listening.
RING_TTL_S = 60


def ring(client: redis.Redis, keys: Keys, region: str) -> None:
    """Tell the dispatcher of ``region`` a slot was freed (one round trip)."""
    key = keys.slots_freed(region)
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, "1")
    pipe.ltrim(key, 0, 0)
    pipe.expire(key, RING_TTL_S)
    pipe.execute()


def wait_for_ring(client: redis.Redis, keys: Keys, regions: Sequence[str], timeout: float) -> bool:
    """Block up to ``timeout`` seconds for a freed slot in any region; True if one rang.

    Clears every region's doorbell, so the tick that follows serves all of them.
    """
    names = [keys.slots_freed(region) for region in regions]
    rang = client.blpop(names, timeout=max(timeout, 0.001)) is not None
    if rang:
        client.delete(*names)
    return rang
