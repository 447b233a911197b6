"""Check state around a run: the region's step and the open maintenance window, handed to the
post-exec write (``complete.lua``), which moves the check's state and makes the transition in
the same atomic call; and reading the state back for the CLI and the live view.

The rules are pure (:mod:`scheduling_core.health`); this module only resolves a job's
thresholds against the settings and reads the maintenance windows that apply.

The degraded contract: an outcome (or its record's ``detail``) may carry ``degraded``, a reason
string or None; a success with a reason is a degraded result. It is read defensively (a missing
attribute is not degraded), so probes that never set it work unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from celery_app.checks.maintenance import WINDOWS, Window, open_until, windows_for_check
from celery_app.redis.schema import (
    CheckStateField,
    JobField,
    Keys,
    TransitionField,
    job_id,
)
from celery_app.settings import Settings
from scheduling_core.health import (
    RegionHealth,
    State,
    classify,
    effective_quorum,
    region_step,
)

if TYPE_CHECKING:
    from celery_app.checks.jobs import JobState


@dataclass(frozen=True)
class HealthUpdate:
    """What complete.lua needs to move a check's state after one run of one region."""

    uid: str
    tenant: str
    regions: tuple[str, ...]
    region_health: RegionHealth
    quorum: int
    now: float
    maintenance_until: float | None = None
    check_maxlen: int = 100
    tenant_maxlen: int = 1000

    def plan(self) -> dict[str, Any]:
        """The ``health`` of complete.lua's plan (see its header)."""
        health = self.region_health
        plan: dict[str, Any] = {
            "state": str(health.state),
            "streak_state": str(health.streak_state),
            "streak": str(health.streak),
            "quorum": str(self.quorum),
            "now": f"{self.now:.3f}",
            "check_maxlen": str(self.check_maxlen),
            "tenant_maxlen": str(self.tenant_maxlen),
            "tenant": self.tenant,
            "uid": self.uid,
            "regions": list(self.regions),
        }
        if self.maintenance_until is not None:
            plan["hold_until"] = f"{self.maintenance_until:.3f}"
        return plan

    def script_keys(self, keys: Keys) -> list[str]:
        """complete.lua's KEYS 8.. (see its header)."""
        return [
            keys.check_state(self.uid),
            keys.check_transitions(self.uid),
            keys.tenant_transitions(self.tenant),
            keys.transition_outbox(),
            keys.transition_payloads(),
            keys.maintenance_held(),
            *(keys.job(job_id(self.uid, r)) for r in self.regions),
        ]


def thresholds(settings: Settings, job: JobState) -> tuple[int, int]:
    """(failure_threshold, success_threshold) of a job: its check's, else the settings'."""
    return (
        job.failure_threshold or settings.failure_threshold,
        job.success_threshold or settings.success_threshold,
    )


def degraded_reason(outcome: Any) -> str | None:
    """The ``degraded`` reason an outcome carries (attribute or ``detail`` key), else None."""
    reason = getattr(outcome, "degraded", None)
    if reason is None:
        detail = getattr(outcome, "detail", None)
        if isinstance(detail, Mapping):
            reason = detail.get("degraded")
    return str(reason) if reason else None


def result_state(ok: bool, outcome: Any = None) -> State:
    """The state one run points to (see :func:`scheduling_core.health.classify`)."""
    return classify(ok, degraded_reason(outcome) if ok else None)


def plan_health(
    client: Any,
    keys: Keys,
    settings: Settings,
    job: JobState,
    now: datetime,
    result: State,
    windows: list[Window] | None = None,
) -> HealthUpdate:
    """The update of ``job``'s region after a run pointing to ``result``, at ``now`` (Redis
    time), with the end of an open maintenance window of the check or its tenant (``windows``
    when the caller has them, else read)."""
    failure, success = thresholds(settings, job)
    if windows is None:
        windows = windows_for_check(client, keys, job.uid, job.tenant)
    until = open_until(windows, now)
    return HealthUpdate(
        uid=job.uid,
        tenant=job.tenant,
        regions=job.regions or (job.region,),
        region_health=region_step(job.health, result, failure, success),
        quorum=effective_quorum(job.quorum, len(job.regions or (job.region,))),
        now=now.timestamp(),
        maintenance_until=None if until is None else until.timestamp(),
        check_maxlen=settings.transitions_history,
        tenant_maxlen=settings.tenant_transitions_history,
    )


@runtime_checkable
class Prefetching(Protocol):
    """Reads that ride on a round trip another step makes: ``prefetch`` queues them on its
    pipeline, ``prefetched`` takes their replies (this reader's part, in queue order) after it
    ran. :class:`HealthPlanner`, :class:`~celery_app.checks.dispatch.RefillNeeds` and
    ``workers.refill_prefetch.HealthWithRefillNeeds`` are such readers."""

    def prefetch(self, pipe: Any) -> None: ...

    def prefetched(self, replies: list[Any]) -> None: ...


class HealthPlanner:
    """``health_of`` for :func:`~celery_app.checks.completion.finish_run_with_health` on a worker:
    it has the maintenance version read with the job (``prefetch``), so the windows come from
    the process cache unless they changed."""

    def __init__(self, client: Any, keys: Keys, settings: Settings, result: State) -> None:
        self.client, self.keys, self.settings, self.result = client, keys, settings, result
        self.version: str | None = None

    def prefetch(self, pipe: Any) -> None:
        pipe.get(self.keys.maintenance_version())

    def prefetched(self, replies: list[Any]) -> None:
        self.version = replies[0]

    def __call__(self, job: JobState, now: datetime) -> HealthUpdate:
        windows = WINDOWS.windows(self.client, self.keys, job.uid, job.tenant, self.version)
        return plan_health(
            self.client, self.keys, self.settings, job, now, self.result, windows=windows
        )


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckHealth:
    """A check's state as the CLI and the live view show it."""

    state: State
    observed: State
    since: float | None
    transitions: int
    last_transition: str | None
    held_until: float | None
    regions: dict[str, State]

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "observed": str(self.observed),
            "since": self.since,
            "transitions": self.transitions,
            "last_transition": self.last_transition,
            "held_until": self.held_until,
            "regions": {r: str(s) for r, s in self.regions.items()},
        }


def decode_health(h: Mapping[str, str], regions: Mapping[str, State]) -> CheckHealth:
    since = h.get(CheckStateField.SINCE)
    held = h.get(CheckStateField.HELD_UNTIL)
    return CheckHealth(
        state=State(h.get(CheckStateField.STATE) or State.UP),
        observed=State(h.get(CheckStateField.OBSERVED) or h.get(CheckStateField.STATE) or "up"),
        since=float(since) if since else None,
        transitions=int(h.get(CheckStateField.SEQ) or 0),
        last_transition=h.get(CheckStateField.LAST_TRANSITION),
        held_until=float(held) if held else None,
        regions=dict(regions),
    )


def read_transitions(client: Any, key: str, count: int = 20) -> list[dict[str, Any]]:
    """The newest ``count`` transitions of a stream (a check's or a tenant's), newest first."""
    return [
        json.loads(fields[TransitionField.RECORD])
        for _id, fields in client.xrevrange(key, count=count)
    ]


def read_tenant_transitions(
    client: Any, keys: Keys, tenant: str, count: int = 20
) -> list[dict[str, Any]]:
    """The newest ``count`` transitions of a tenant's checks, newest first: its stream in
    each partition of the check half, merged by time."""
    merged = [
        t for part in keys.every_partition()
        for t in read_transitions(client, part.tenant_transitions(tenant), count)
    ]  # fmt: skip
    return sorted(merged, key=lambda t: t[TransitionField.AT], reverse=True)[:count]


def read_check_health(client: Any, keys: Keys, uid: str, regions: tuple[str, ...]) -> CheckHealth:
    """A check's state and its regions' states, in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.check_state(uid))
    for region in regions:
        pipe.hget(keys.job(job_id(uid, region)), JobField.HEALTH)
    h, *states = pipe.execute()
    return decode_health(h, {r: State(s or State.UP) for r, s in zip(regions, states, strict=True)})
