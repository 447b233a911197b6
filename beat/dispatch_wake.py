"""Beat's sleep, cut short when a check's tick is written (``Keys.dispatch_wake``).

Why: beat sleeps until its next due job enters the dispatch lead, and at most
``CHECKBEAT_DISPATCH_INTERVAL``. A check created meanwhile may have its first tick before that
wake-up, and its first run would start up to the interval late; the first runs of a mass
creation, each next tick counting from a late start, would bunch into a burst a period later. Every
batch the check store's ``store.lua`` writes PUBLISHes on the channel, in the same call (no
round trip of its own, nothing written without it); beat waits on it instead of sleeping.

A lost message or a broken subscription only costs what it cost before: beat wakes at its
planned time. A connection error is logged once and the wait becomes a sleep; the next wait
subscribes again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


#: Wake-ups come at most this often: a stream of writes (an import, a busy API) is dispatched
#: in batches, ten ticks a second at most, not one tick per write for every beat.
MIN_WAKE_GAP_S = 0.1


class WakeListener:
    """Waits up to a given time for a message on any of ``channels``."""

    def __init__(self, client: Any, channels: Sequence[str]) -> None:
        self.client, self.channels = client, list(channels)
        self._pubsub: Any = None
        self._failing = False
        self._last_wake = float("-inf")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as a message came, but not sooner than
        :data:`MIN_WAKE_GAP_S` after the previous wake-up (what came meanwhile is drained)."""
        deadline = time.monotonic() + seconds
        try:
            pubsub = self._subscribed()
            while (left := deadline - time.monotonic()) > 0:
                if pubsub.get_message(ignore_subscribe_messages=True, timeout=left) is not None:
                    self._settle(pubsub, min(deadline, self._last_wake + MIN_WAKE_GAP_S))
                    self._last_wake = time.monotonic()
                    return True
            self._failing = False
            return False
        except Exception as exc:  # redis-py's cluster errors are not all RedisErrors
            if not self._failing:
                log.warning("beat: dispatch wake-ups unavailable (%s); sleeping instead", exc)
            self._failing = True
            self.close()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False

    @staticmethod
    def _settle(pubsub: Any, until: float) -> None:
        """Drain the messages that came, and those that come before ``until``."""
        while True:
            left = until - time.monotonic()
            message = pubsub.get_message(ignore_subscribe_messages=True, timeout=max(0.0, left))
            if message is None and left <= 0:
                return

    def _subscribed(self) -> Any:
        if self._pubsub is None:
            pubsub = self.client.pubsub()
            pubsub.subscribe(*self.channels)
            self._pubsub = pubsub
        return self._pubsub

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):  # a broken connection: nothing left to do
                pubsub.close()
