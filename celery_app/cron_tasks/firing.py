"""Firing cron windows: claim, publish, then confirm, or record the failed publish.

Why one module: the beat's engine and ``schedule run`` (run-now) must fire through the same
steps, or a window could be lost or sent twice in one of them only. The claim (the per-window
keys, :meth:`CronStore.claim`) decides who sends; what it hands out is never claimed again, so a
publish that fails is recorded (list and diagnose show it), not retried.

Publish at least once: a claim stays pending (with a lease of ``CRON_CLAIM_LEASE_S``) until the
publish is confirmed; a claimer that dies or stalls in between is taken over by one other beat
(:func:`take_over_expired`), which publishes the windows whose deadline has not passed. A
window published twice that way (the first publish was only slow) runs once: the worker's run
key (:mod:`celery_app.cron_tasks.recording`) suppresses the second delivery.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from celery_app.cron_tasks.cron_state import (
    CronStore,
    FireRequest,
    parse_window_id,
    split_member,
    window_deadline,
)
from celery_app.cron_tasks.registration import CronTask
from celery_app.redis.schema import CronClaimCode, CronSkipReason

log = logging.getLogger(__name__)

#: Test-only: a beat given this path writes the file after a claim, then blocks before
#: publishing (until killed), so a fault test kills it exactly between claim and publish.
TEST_PAUSE_AFTER_CLAIM_ENV = "CHECKBEAT_TEST_PAUSE_AFTER_CLAIM"

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
    if not manual:
        _test_pause_after_claim()
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


def _test_pause_after_claim() -> None:
    path = os.environ.get(TEST_PAUSE_AFTER_CLAIM_ENV)
    if not path:
        return
    with open(path, "w") as marker:
        marker.write(str(os.getpid()))
    log.warning("cron: %s set, blocking after the claim (test only)", TEST_PAUSE_AFTER_CLAIM_ENV)
    threading.Event().wait()


@dataclass(frozen=True)
class Takeover:
    """What :func:`take_over_expired` did: ``published`` for dead claimers, ``lost`` (members
    that could not be sent any more, now gap records)."""

    published: tuple[FireRequest, ...] = ()
    lost: tuple[str, ...] = ()


def take_over_expired(
    store: CronStore,
    sender: Sender,
    task_of: Callable[[str], CronTask | None],
    *,
    now: datetime,
    owner: str,
) -> Takeover:
    """Publish the claims whose lease ended unconfirmed; one caller of all wins each claim.

    A member whose window deadline has passed, or whose task this caller does not know, is a
    gap record ("claimed by X, never published"). Redis errors propagate (the next tick
    retries: the claim's lease ends again).
    """
    published: list[FireRequest] = []
    lost: list[str] = []
    for batch in store.expired_claims(now):
        claim = store.take_over(batch, now)
        if claim is None:
            continue  # another beat won it, or it was confirmed meanwhile
        to_send: list[FireRequest] = []
        late: list[str] = []
        unknown: list[str] = []
        for member in claim.members:
            task_id, tenant, wid = split_member(member)
            task = task_of(task_id)
            window = parse_window_id(wid)
            if task is None:
                unknown.append(member)
            elif window_deadline(window, store.grace) <= now:
                late.append(member)
            else:
                # a custom schedule's window id names its shared last run, not a start
                to_send.append(FireRequest(task, tenant, window, wid=wid if task.is_custom else ""))
        if late:
            store.record_never_published(claim, late, now, f"deadline passed; found by {owner}")
        if unknown:
            store.record_never_published(claim, unknown, now, f"task unknown to {owner}")
        lost.extend(late + unknown)
        log.error(
            "cron: took over claim %s of %s: publishing %d, %d lost",
            batch,
            claim.owner,
            len(to_send),
            len(late) + len(unknown),
        )
        try:
            sender.publish(to_send, manual=claim.manual)
        except Exception as exc:
            error = f"publish failed after takeover: {type(exc).__name__}: {exc}"
            log.error("cron: %s", error)
            store.record_send_failure(to_send, error, now, claim)
            lost.extend(req.member for req in to_send)
            continue
        store.confirm_taken_over(claim, to_send)
        published.extend(to_send)
    return Takeover(tuple(published), tuple(lost))
