"""The ``checkbeat.deliver_transition`` task: run the ``@on_transition`` hooks for one transition,
exactly once per transition (the protocol is in :mod:`celery_app.checks.transitions`).

acks_late with reject_on_worker_lost: a delivery whose pool process dies is requeued and the
same message (same Celery task id, the lease owner) takes its lease over; a worker killed
outright leaves the lease to expire, after which beat's sweep publishes the transition again.
Before the hooks, the transition is sent to the notification targets of its check and tenant
(``celery_app/checks/notify.py``, ``notify_send.py``), each send's outcome recorded per
target. A hook that raises or a target that fails is retried by the queue with exponential
backoff, up to ``CHECKBEAT_TRANSITION_RETRIES``; a retry sends only to the targets not sent to
yet, and runs the hooks only if they did not all return before. Then the transition is kept in
``Keys.transition_failed``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from celery.exceptions import Reject

from celery_app.checks.notify import (
    NotifyStore,
    NotifyTarget,
    Outcome,
    hooks_done,
    read_outcomes,
    record_hooks_done,
    record_outcome,
    scrubbed_error,
)
from celery_app.checks.notify_send import send
from celery_app.checks.transitions import (
    TRANSITION_TASK,
    Transition,
    delivery_lease_s,
    finish_delivery,
    start_delivery,
)
from celery_app.factory import settings_of
from celery_app.names import MAX_ID
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import DeliveryOutcome, Keys, TransitionStart
from celery_app.registry import registry_of
from celery_app.settings import Settings
from workers.target_guard import AddressPolicy, TargetRefused, vetted_resolution

log = logging.getLogger(__name__)

#: Longest wait between two retries of a failing hook, in seconds.
MAX_BACKOFF_S = 300.0
#: The longest transition id: ``<uid>#<seq>``.
MAX_TRANSITION_ID = MAX_ID + 21


def _bad_id(transition_id: Any) -> str | None:
    """Why ``transition_id`` (from a message anyone on the broker may send) is not one, or None."""
    if not isinstance(transition_id, str):
        return f"transition_id must be a string, got {type(transition_id).__name__}"
    if not 0 < len(transition_id) <= MAX_TRANSITION_ID or "#" not in transition_id:
        return f"transition_id must be '<uid>#<seq>' of at most {MAX_TRANSITION_ID} characters"
    return None


@shared_task(
    name=TRANSITION_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def deliver_transition(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Send the transition to its check's and tenant's notification targets and run every
    registered hook with it, unless it was delivered or another delivery holds it. A
    malformed message (forged: publish.py sends one keyword, ``transition_id``, a string) is
    logged on one line and rejected, never retried."""
    # Any: a message's; _bad_id leaves only a string
    transition_id: Any = kwargs.get("transition_id") if not args else args[0]
    problem = _bad_id(transition_id)
    if problem is None and len(args) + len(kwargs) != 1:
        problem = "takes one argument, transition_id"
    if problem is not None:
        log.error("checkbeat: rejected deliver_transition %s: %s", self.request.id, problem)
        raise Reject(f"bad deliver_transition message: {problem}", requeue=False)
    settings = settings_of(self.app)
    client = get_redis(settings.redis_url, settings)
    keys = state_keys(settings).of_transition(transition_id)
    owner = self.request.id or transition_id
    verdict, payload = start_delivery(client, keys, settings, transition_id, owner, time.time())
    if verdict != TransitionStart.RUN or payload is None:
        log.info("checkbeat: transition %s not delivered again: %s", transition_id, verdict)
        return {"transition": transition_id, "skipped": str(verdict)}
    transition = Transition.from_json(payload)
    failures = notify_targets(client, keys, settings, transition, payload)
    hooks = registry_of(self.app).transition_hooks()
    if hooks and hooks_done(client, keys, transition_id):
        hooks = {}  # they returned in an earlier attempt; a retry is for a target
    try:
        for hook in hooks.values():
            hook(transition)
    except Exception as exc:
        log.warning("checkbeat: a hook of transition %s raised", transition_id, exc_info=True)
        failures.append(f"hook: {type(exc).__name__}: {exc}")
    else:
        if hooks:
            record_hooks_done(client, keys, transition_id, time.time())
    if failures:
        error = "; ".join(failures)
        retries = self.request.retries or 0
        if retries >= settings.transition_retries:
            log.error(
                "checkbeat: transition %s failed after %d retries: %s",
                transition_id,
                retries,
                error,
            )
            finish_delivery(
                client,
                keys,
                transition_id,
                owner,
                DeliveryOutcome.FAILED,
                time.time(),
                error={"error": error, "payload": payload},
            )
            return {"transition": transition_id, "failed": error}
        countdown = min(2.0**retries, MAX_BACKOFF_S)
        finish_delivery(
            client,
            keys,
            transition_id,
            owner,
            DeliveryOutcome.RETRY,
            time.time(),
            retry_in=countdown + delivery_lease_s(settings),
        )
        raise self.retry(
            exc=RuntimeError(error), countdown=countdown, max_retries=settings.transition_retries
        )
    finish_delivery(client, keys, transition_id, owner, DeliveryOutcome.DELIVERED, time.time())
    return {"transition": transition_id, "delivered": len(hooks)}


def send_vetted(
    target: NotifyTarget,
    transition: Transition,
    payload: str,
    timeout: float,
    policy: AddressPolicy,
) -> None:
    """:func:`~celery_app.checks.notify_send.send`, reaching only the addresses a probe may (a
    target is a tenant's URL as a probe's target is); a refusal is raised as such, whatever
    the client made of it."""
    with vetted_resolution(policy) as vetting:
        try:
            send(target, transition, payload, timeout=timeout)
        except Exception:
            if vetting.refused:
                raise TargetRefused(vetting.refused[0]) from None
            raise


def notify_targets(
    client: Any, keys: Keys, settings: Settings, transition: Transition, payload: str
) -> list[str]:
    """Send the transition to every target of its check and tenant not sent to yet (the
    outcome of each attempt is recorded per target, so a retry sends only what is missing);
    the failures, one line each, scrubbed of the targets' secrets."""
    targets = NotifyStore(client, keys).for_check(transition.uid, transition.tenant)
    if not targets:
        return []
    before = read_outcomes(client, keys, transition.id)
    policy = AddressPolicy.from_settings(settings)
    failures: list[str] = []
    for target in targets:
        previous = before.get(target.id)
        if previous is not None and previous.ok:
            continue
        error: str | None = None
        try:
            send_vetted(target, transition, payload, settings.transition_timeout / 2, policy)
        except Exception as exc:
            error = scrubbed_error(f"{type(exc).__name__}: {exc}", target)
            failures.append(f"{target.id} ({target.shown}): {error}")
            log.warning(
                "checkbeat: transition %s not sent to %s: %s", transition.id, target.shown, error
            )
        outcome = Outcome(
            target=target.shown,
            scope=target.scope,
            ok=error is None,
            at=time.time(),
            attempts=(previous.attempts if previous else 0) + 1,
            error=error,
        )
        record_outcome(client, keys, transition.id, target.id, outcome)
    return failures
