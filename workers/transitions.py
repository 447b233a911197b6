"""The ``checkbeat.deliver_transition`` task: run the ``@on_transition`` hooks for one transition,
exactly once per transition (the protocol is in :mod:`celery_app.checks.transitions`).

acks_late with reject_on_worker_lost: a delivery whose pool process dies is requeued and the
same message (same Celery task id, the lease owner) takes its lease over; a worker killed
outright leaves the lease to expire, after which beat's sweep publishes the transition again.
A hook that raises is retried by the queue with exponential backoff, up to
``CHECKBEAT_TRANSITION_RETRIES``; then the transition is kept in ``Keys.transition_failed``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from celery.exceptions import Reject

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
from celery_app.redis.schema import DeliveryOutcome, TransitionStart
from celery_app.registry import registry_of

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
    """Run every registered hook with the transition, unless it was delivered or another
    delivery holds it. A malformed message (forged: publish.py sends one keyword,
    ``transition_id``, a string) is logged on one line and rejected, never retried."""
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
    hooks = registry_of(self.app).transition_hooks()
    try:
        for hook in hooks.values():
            hook(transition)
    except Exception as exc:
        retries = self.request.retries or 0
        if retries >= settings.transition_retries:
            log.exception(
                "checkbeat: transition %s failed after %d retries", transition_id, retries
            )
            finish_delivery(
                client,
                keys,
                transition_id,
                owner,
                DeliveryOutcome.FAILED,
                time.time(),
                error={"error": f"{type(exc).__name__}: {exc}", "payload": payload},
            )
            return {"transition": transition_id, "failed": str(exc)}
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
            exc=exc, countdown=countdown, max_retries=settings.transition_retries
        ) from exc
    finish_delivery(client, keys, transition_id, owner, DeliveryOutcome.DELIVERED, time.time())
    return {"transition": transition_id, "delivered": len(hooks)}
