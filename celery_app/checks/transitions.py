"""Transitions of a check's state, delivered once to the ``@on_transition`` hooks.

How exactly one delivery is made, however many beats and workers run:

1. the transition is created inside the atomic post-exec write (``complete.lua``, or
   ``transition_release.lua`` when a maintenance window ends) with its id ``<uid>#<seq>``, its
   JSON in the check's and the tenant's capped streams, and its id in the **outbox**
   (``Keys.transition_outbox``, score = when it may be published);
2. a publisher *claims* it (``transition_claim.lua``: score <= now moves to now + lease) and
   sends one ``checkbeat.deliver_transition`` message: the worker that made it does so at once,
   and every beat tick sweeps the outbox for ones whose claim lapsed (publisher or delivering
   worker killed); each claim of an id doubles its lease (at most MAX_CLAIM_LEASE_S), so a queue
   nobody consumes gets a copy now and then, not one per lease;
3. the delivery task (``workers/deliver_transition.py``) runs the hooks only if the id is still in
   the outbox and no other delivery holds its lease (``transition_start.lua``, SET PX with the
   Celery task id as owner, so the same message redelivered after a lost worker takes it over);
   when the hooks return it removes the id (``transition_finish.lua``). A hook that raises is
   retried by the queue (``self.retry``), each retry with the same transition id.

A duplicate message (a lapsed claim republished while the first still waited in the queue)
finds the id delivered or leased and is dropped: the hooks complete once per transition. A
delivery killed mid-hook is run again (the hook sees the same transition id: its own
idempotency key).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_app.checks.maintenance import open_until, windows_for_check
from celery_app.publish import TaskMessage, publish_all
from celery_app.redis.schema import (
    CheckField,
    DeliveryOutcome,
    Keys,
    TransitionField,
    TransitionStart,
    job_id,
)
from celery_app.redis.scripts import run_script
from celery_app.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

TRANSITION_TASK = "checkbeat.deliver_transition"
#: Seconds a delivery's lease outlives its time limit before the transition is published again.
DELIVERY_MARGIN_S = 2.0
#: Transitions one sweep publishes at most.
SWEEP_LIMIT = 500
#: The longest a claim holds a transition (its lease doubles with each claim).
MAX_CLAIM_LEASE_S = 3600.0


@dataclass(frozen=True)
class Transition:
    """One change of a check's overall state, as a hook receives it."""

    id: str
    uid: str
    tenant: str
    from_state: str
    to_state: str
    at: float
    held: bool = False
    regions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> Transition:
        data = json.loads(text)
        regions = data.get(TransitionField.REGIONS) or {}
        return cls(
            id=data[TransitionField.ID],
            uid=data[TransitionField.UID],
            tenant=data[TransitionField.TENANT],
            from_state=data[TransitionField.FROM],
            to_state=data[TransitionField.TO],
            at=float(data[TransitionField.AT]),
            held=bool(data.get(TransitionField.HELD)),
            regions=regions if isinstance(regions, dict) else {},
        )

    @property
    def at_datetime(self) -> datetime:
        from celery_app.checks.jobs import from_unix

        return from_unix(self.at)

    def describe(self) -> str:
        held = " (held by maintenance until now)" if self.held else ""
        return f"{self.uid} [{self.tenant}] {self.from_state} -> {self.to_state}{held} ({self.id})"


def delivery_lease_s(settings: Settings) -> float:
    """How long a claim or a delivery holds a transition: the hook time limit plus a margin."""
    return settings.transition_timeout + DELIVERY_MARGIN_S


def transition_message(settings: Settings, transition_id: str) -> TaskMessage:
    """The ``checkbeat.deliver_transition`` message of one transition."""
    return TaskMessage(
        name=TRANSITION_TASK,
        queue=settings.transition_queue,
        kwargs={"transition_id": transition_id},
        soft_time_limit=settings.transition_timeout,
        time_limit=settings.transition_timeout + 1.0,
    )


def claim(
    client: Any,
    keys: Keys,
    settings: Settings,
    now: float,
    ids: Sequence[str] = (),
    limit: int = SWEEP_LIMIT,
) -> list[str]:
    """Claim ``ids`` (or the due ones) for publishing; only the claimed may be sent."""
    return list(
        run_script(
            client,
            "transition_claim",
            keys=[keys.transition_outbox(), keys.transition_claims()],
            args=[f"{now:.3f}", delivery_lease_s(settings), limit, MAX_CLAIM_LEASE_S, *ids],
        )
    )


def claim_and_publish(
    app: Celery, client: Any, keys: Keys, settings: Settings, now: float, ids: Sequence[str] = ()
) -> list[str]:
    """Claim and send: the ids published (a claim whose send fails lapses and is retried)."""
    claimed = claim(client, keys, settings, now, ids)
    if claimed:
        publish_all(app, [transition_message(settings, t) for t in claimed])
    return claimed


def release_held(client: Any, keys: Keys, settings: Settings, now: float) -> list[str]:
    """Deliver the transitions held by maintenance windows that have ended (or hold them again
    when another window is open): the ids of the transitions made."""
    from celery_app.checks.jobs import from_unix

    made: list[str] = []
    uids = client.zrangebyscore(keys.maintenance_held(), "-inf", f"{now:.3f}", 0, SWEEP_LIMIT)
    for uid in uids:
        check = client.hmget(keys.check(uid), CheckField.TENANT, CheckField.REGIONS)
        tenant, regions_text = check[0] or "", check[1] or ""
        regions = [r for r in regions_text.split(",") if r]
        until = open_until(windows_for_check(client, keys, uid, tenant), from_unix(now))
        result = run_script(
            client,
            "transition_release",
            keys=[
                keys.check_state(uid),
                keys.check_transitions(uid),
                keys.tenant_transitions(tenant),
                keys.transition_outbox(),
                keys.transition_payloads(),
                keys.maintenance_held(),
                keys.last_result(uid),
                *(keys.job(job_id(uid, r)) for r in regions),
            ],
            args=[
                uid,
                tenant,
                ",".join(regions),
                f"{now:.3f}",
                "" if until is None else f"{until.timestamp():.3f}",
                settings.transitions_history,
                settings.tenant_transitions_history,
            ],
        )
        if isinstance(result, str):
            made.append(result)
    return made


def sweep(app: Celery, client: Any, keys: Keys, settings: Settings, now: float) -> list[str]:
    """Beat's share, once a dispatch interval: release what maintenance held, then publish every
    transition whose claim lapsed or that nobody published yet."""
    release_held(client, keys, settings, now)
    return claim_and_publish(app, client, keys, settings, now)


# --- the delivery's two steps (the task is in workers/deliver_transition.py) ---------------------


def start_delivery(
    client: Any, keys: Keys, settings: Settings, transition_id: str, owner: str, now: float
) -> tuple[TransitionStart, str | None]:
    """(RUN, payload) when this delivery runs the hooks, else (DONE | BUSY, None)."""
    reply = run_script(
        client,
        "transition_start",
        keys=[
            keys.transition_outbox(),
            keys.transition_payloads(),
            keys.transition_delivery(transition_id),
        ],
        args=[transition_id, owner, int(delivery_lease_s(settings) * 1000), f"{now:.3f}"],
    )
    verdict = TransitionStart(reply[0])
    return verdict, (reply[1] if verdict == TransitionStart.RUN else None)


def finish_delivery(
    client: Any,
    keys: Keys,
    transition_id: str,
    owner: str,
    outcome: DeliveryOutcome,
    now: float,
    *,
    retry_in: float = 0.0,
    error: Mapping[str, Any] | None = None,
) -> bool:
    """Record the delivery's end: ``delivered``, ``retry`` (republishable after ``retry_in``)
    or ``failed`` (kept with ``error``). False when the lease was not this delivery's."""
    return bool(
        run_script(
            client,
            "transition_finish",
            keys=[
                keys.transition_outbox(),
                keys.transition_payloads(),
                keys.transition_delivery(transition_id),
                keys.transition_failed(),
                keys.transition_claims(),
            ],
            args=[
                transition_id,
                owner,
                str(outcome),
                f"{now:.3f}",
                f"{retry_in:.3f}",
                json.dumps(dict(error or {}), separators=(",", ":")),
            ],
        )
    )


def pending(client: Any, keys: Keys) -> int:
    """Transitions not delivered yet (in the outbox of every partition)."""
    pipe = client.pipeline(transaction=False)
    for part in keys.every_partition():
        pipe.zcard(part.transition_outbox())
    return sum(int(n) for n in pipe.execute())


def ids_of(transitions: Iterable[Mapping[str, Any]]) -> list[str]:
    return [t[TransitionField.ID] for t in transitions]
