"""Firing cron windows: claim, publish, then confirm, or record the failed publish.

Why one module: the beat's engine and ``schedule run`` (run-now) must fire through the same
steps, or a window could be lost or sent twice in one of them only. The claim (the per-window
keys, :meth:`CronStore.claim`) decides who sends; what it hands out is never claimed again, so a
publish that fails is recorded (list and diagnose show it), not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from celery_app.cron_tasks.registration import CronTask
from celery_app.cron_tasks.store import CronStore, FireRequest
from celery_app.redis.schema import CronClaimCode, CronSkipReason

log = logging.getLogger(__name__)

_SKIPPED_BY_CODE = {
    CronClaimCode.TAKEN: CronSkipReason.TAKEN,
    CronClaimCode.IN_FLIGHT: CronSkipReason.IN_FLIGHT,
}


class Sender(Protocol):
    """Publishes the messages of fired requests; raises if they could not all be sent."""

    def publish(self, requests: Sequence[FireRequest], *, manual: bool = False) -> list[str]: ...


@dataclass(frozen=True)
class Firing:
    """What one firing did: ``fired`` went to the broker (``celery_ids`` in the same order),
    ``skipped`` did not, with the reason; ``error`` (and the exception, ``cause``) is set when
    the publish failed."""

    fired: tuple[FireRequest, ...] = ()
    celery_ids: tuple[str, ...] = ()
    skipped: tuple[tuple[FireRequest, CronSkipReason], ...] = ()
    error: str | None = None
    cause: BaseException | None = None


def fire(
    store: CronStore,
    sender: Sender,
    requests: Sequence[FireRequest],
    *,
    now: datetime,
    owner: str,
    manual: bool = False,
    marks: Iterable[tuple[CronTask, datetime]] = (),
) -> Firing:
    """Claim ``requests`` for ``owner``, publish what this caller won and confirm it.

    Raises only if the claim itself fails (Redis unreachable: nothing was taken, the caller may
    retry). A failed publish is recorded and reported as ``send-failed`` skips; a failed
    confirmation is logged (the claim stays pending, diagnose then checks that the runs began).
    """
    claim = store.claim(requests, now=now, owner=owner, manual=manual, marks=marks)
    to_send: list[FireRequest] = []
    skipped: list[tuple[FireRequest, CronSkipReason]] = []
    for req, code in zip(requests, claim, strict=True):
        if code == CronClaimCode.FIRE:
            to_send.append(req)
        else:
            skipped.append((req, _SKIPPED_BY_CODE[code]))
    if not to_send:
        return Firing(skipped=tuple(skipped))
    try:
        celery_ids = sender.publish(to_send, manual=manual)
    except Exception as exc:
        # The window keys stay taken: retrying could fire twice. Record instead.
        error = f"publish failed: {type(exc).__name__}: {exc}"
        if not manual:  # a run-now reports it to the operator itself
            log.error("cron: %d messages not published: %s", len(to_send), error)
        try:
            store.record_send_failure(to_send, error, now, claim)
        except Exception:
            log.exception("cron: could not record the failed publish (left as pending)")
        failed = [(req, CronSkipReason.SEND_FAILED) for req in to_send]
        return Firing(skipped=tuple(skipped + failed), error=error, cause=exc)
    try:
        store.confirm_sent(claim)
    except Exception:
        log.exception("cron: published, but could not confirm %d sends", len(to_send))
    return Firing(tuple(to_send), tuple(celery_ids), tuple(skipped))
