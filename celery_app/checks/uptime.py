"""Uptime reports: a check's (or a tenant's checks') uptime, downtime, degraded time, incidents
and time with no data over a range, from what the store keeps (docs/reports.md).

The accounting is ``scheduling_core.uptime``; this module reads its inputs: the check's
transitions stream, its state hash (``CheckStateField.FIRST``: its first counted result; ``SEQ``),
its oldest retained result, and the check's and its tenant's maintenance windows. Reads are
pipelined in chunks of checks, so a tenant's report costs a few round trips whatever its size.

What the store cannot tell is said in the report's ``notes`` (and docs/reports.md): history
before the oldest retained transition of a capped stream, a region's state between the check's
transitions, when a check was disabled, windows as they were defined in the past.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_app.checks.maintenance import Window, decode_windows
from celery_app.errors import CheckFieldError, CheckNotFound
from celery_app.names import ID_RULE, TENANT_RULE, is_id, is_tenant
from celery_app.redis.schema import (
    CheckField,
    CheckStateField,
    Keys,
    ResultField,
    TransitionField,
    maintenance_scope,
)
from scheduling_core import parse
from scheduling_core.health import State
from scheduling_core.uptime import (
    MAX_RANGE,
    Bucket,
    History,
    Step,
    Totals,
    account,
    bucket_spans,
    merge_spans,
    segments,
    window_spans,
)

#: Checks read per pipelined round trip.
CHUNK = 500
#: How much earlier than the recorded first result a kept result may finish and still be that
#: first run (its finish precedes the write that records it by the post-exec step).
EVIDENCE_SLACK_S = 1.0

REGION_NOTE = (
    "region states are recorded only at the check's transitions: a region's change that did not "
    "move the check's state is not seen"
)


@dataclass(frozen=True)
class Period:
    """One row of a report: a range's accounting."""

    totals: Totals

    def as_dict(self) -> dict[str, Any]:
        t = self.totals
        return {
            "from": _iso(t.start),
            "to": _iso(t.end),
            "uptime_pct": _round(t.uptime_pct, 4),
            "healthy_pct": _round(t.healthy_pct, 4),
            "up_s": _round(t.up, 3),
            "degraded_s": _round(t.degraded, 3),
            "down_s": _round(t.down, 3),
            "maintenance_s": _round(t.maintenance, 3),
            "no_data_s": _round(t.no_data, 3),
            "incidents": t.incidents,
            "longest_incident_s": _round(t.longest_incident, 3),
            "mttr_s": _round(t.mttr, 3),
        }


@dataclass(frozen=True)
class CheckReport:
    """One check's report: the whole range, its buckets (empty without ``by``), and what the
    stored data could not support (``notes``)."""

    uid: str
    tenant: str
    region: str | None
    history_start: float | None
    total: Period
    buckets: list[Period]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "tenant": self.tenant,
            "region": self.region,
            "history_start": _iso(self.history_start),
            "total": self.total.as_dict(),
            "buckets": [b.as_dict() for b in self.buckets],
            "notes": list(self.notes),
        }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# --- input ---------------------------------------------------------------------------------


def parse_instant(value: Any, name: str) -> float:
    """An ISO 8601 instant (a date alone is its midnight; no offset means UTC) as Unix s, or a
    CheckFieldError naming the option."""
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise CheckFieldError(
                name,
                f"{value!r} is not an ISO 8601 instant such as 2026-11-01 or 2026-11-01T00:00Z",
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def validate_request(
    *,
    uid: str | None,
    tenant: str | None,
    start: Any,
    end: Any,
    by: str | None,
    timezone: str | None,
) -> tuple[float, float, Bucket | None, tzinfo]:
    """The checked range, bucket and timezone, or CheckFieldError naming the option."""
    if (uid is None) == (tenant is None):
        raise CheckFieldError("uid", "give exactly one of a check UID and --tenant")
    if uid is not None and not is_id(uid):
        raise CheckFieldError("uid", f"{uid!r} is not allowed: use {ID_RULE}")
    if tenant is not None and not is_tenant(tenant):
        raise CheckFieldError("tenant", f"{tenant!r} is not allowed: use {TENANT_RULE}")
    lo, hi = parse_instant(start, "from"), parse_instant(end, "to")
    if hi <= lo:
        raise CheckFieldError("to", "must be after --from")
    if hi - lo > MAX_RANGE.total_seconds():
        raise CheckFieldError("to", f"the range may span at most {MAX_RANGE.days} days")
    bucket = None
    if by is not None:
        try:
            bucket = Bucket(by)
        except ValueError:
            allowed = "|".join(b.value for b in Bucket)
            raise CheckFieldError("by", f"{by!r} is not allowed: use {allowed}") from None
    try:
        tz: tzinfo = ZoneInfo(timezone) if timezone else UTC
    except (ZoneInfoNotFoundError, ValueError):
        raise CheckFieldError(
            "timezone", f"unknown timezone {timezone!r}; use an IANA name such as Europe/Berlin"
        ) from None
    return lo, hi, bucket, tz


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """What the store keeps about one check's state, decoded."""

    uid: str
    tenant: str
    regions: tuple[str, ...]
    enabled: bool
    steps: tuple[Step, ...]
    first_seq: int | None  # seq of the oldest retained transition
    seq: int  # transitions made so far
    first_result: float | None  # CheckStateField.FIRST
    oldest_result: float | None  # the oldest retained result's finish


def _step(text: str) -> tuple[Step, int]:
    data = json.loads(text)
    regions = data.get(TransitionField.REGIONS) or {}
    states = {
        str(r): State(entry[TransitionField.STATE])
        for r, entry in regions.items()
        if isinstance(entry, dict) and entry.get(TransitionField.STATE) in State._value2member_map_
    }
    seq = int(str(data[TransitionField.ID]).rpartition("#")[2])
    step = Step(
        float(data[TransitionField.AT]),
        State(data[TransitionField.FROM]),
        State(data[TransitionField.TO]),
        states,
    )
    return step, seq


def _finished(entries: Sequence[Any]) -> float | None:
    """When the first of ``entries`` (results stream entries) finished: its RunRecord's
    ``finished_at`` (ISO 8601); None when there is none or it is unreadable."""
    for _id, fields in entries:
        try:
            finished = json.loads(fields[ResultField.RECORD])["finished_at"]
            return datetime.fromisoformat(finished).timestamp()
        except (KeyError, TypeError, ValueError):
            return None
    return None


def read_stored(client: Any, keys: Keys, uids: Sequence[str]) -> dict[str, Stored]:
    """What each existing check of ``uids`` has stored, one pipelined round trip per CHUNK."""
    out: dict[str, Stored] = {}
    for at in range(0, len(uids), CHUNK):
        chunk = uids[at : at + CHUNK]
        pipe = client.pipeline(transaction=False)
        for uid in chunk:
            pipe.hmget(keys.check(uid), CheckField.TENANT, CheckField.REGIONS, CheckField.ENABLED)
            pipe.xrange(keys.check_transitions(uid))
            pipe.hmget(keys.check_state(uid), CheckStateField.FIRST, CheckStateField.SEQ)
            pipe.xrange(keys.results(uid), count=1)
        replies = pipe.execute()
        for i, uid in enumerate(chunk):
            check, stream, state, oldest = replies[4 * i : 4 * i + 4]
            if check[0] is None:
                continue
            decoded = [_step(fields[TransitionField.RECORD]) for _id, fields in stream]
            decoded.sort(key=lambda pair: pair[1])
            out[uid] = Stored(
                uid=uid,
                tenant=check[0],
                regions=tuple(r for r in (check[1] or "").split(",") if r),
                enabled=check[2] != "0",
                steps=tuple(s for s, _ in decoded),
                first_seq=decoded[0][1] if decoded else None,
                seq=int(state[1] or 0),
                first_result=float(state[0]) if state[0] else None,
                oldest_result=_finished(oldest),
            )
    return out


def read_windows(client: Any, keys: Keys, stored: Sequence[Stored]) -> dict[str, list[Window]]:
    """The windows of each check's scope and of each tenant's, by scope; one round trip."""
    home = keys.at(0)  # windows live in the first partition (MaintenanceStore)
    scopes = sorted(
        {maintenance_scope(uid=s.uid) for s in stored}
        | {maintenance_scope(tenant=s.tenant) for s in stored if s.tenant}
    )
    if not scopes:
        return {}
    pipe = client.pipeline(transaction=False)
    for scope in scopes:
        pipe.hgetall(home.maintenance(scope))
    return {
        scope: decode_windows(scope, h)
        for scope, h in zip(scopes, pipe.execute(), strict=True)
        if h
    }


def history_of(stored: Stored, now: float) -> tuple[History, list[str]]:
    """The History the accounting reads, and notes on what the store could not support."""
    notes: list[str] = []
    # complete: the oldest retained transition is the check's first (or it never made one)
    complete = stored.first_seq == 1 if stored.steps else stored.seq == 0
    if not complete:
        known_from: float | None = stored.steps[0].at if stored.steps else None
        notes.append(
            f"history starts at {_iso(known_from)}: older transitions were trimmed from the "
            f"check's capped stream (CHECKBEAT_TRANSITIONS_HISTORY)"
            if known_from is not None
            else "no transition is retained: the state history is unknown"
        )
    else:
        # The oldest evidence kept: the first result recorded (FIRST), the oldest retained result
        # and the check's first transition. FIRST is the earliest for a check created since
        # FIRST is written (a result finishes just before the write that records it); a check
        # that predates it got FIRST at its first state change after, so older evidence wins.
        evidence = [t for t in (stored.first_result, stored.oldest_result) if t is not None]
        evidence += [stored.steps[0].at] if stored.steps else []
        known_from = min(evidence) if evidence else None
        if known_from is not None and (
            stored.first_result is None or known_from < stored.first_result - EVIDENCE_SLACK_S
        ):
            notes.append(
                f"history starts at {_iso(known_from)}: the check's first result is not "
                f"recorded (it predates the record), this is the oldest evidence kept"
            )
    if known_from is None and complete:
        notes.append("no result recorded yet")
    if not stored.enabled:
        notes.append(
            "the check is disabled now; when it was disabled is not recorded: its last state "
            "counts until now"
        )
    return History(stored.steps, known_from, now, complete), notes


def maintenance_of(
    windows: Sequence[Window],
    start: float,
    end: float,
    cache: dict[tuple[str, str], list[tuple[float, float]]] | None = None,
) -> list[tuple[float, float]]:
    """The merged spans of ``windows`` in [start, end); ``cache`` keeps each window's spans for
    the next check of the same report (a tenant's windows apply to all its checks)."""
    cache = {} if cache is None else cache
    spans = []
    for w in windows:
        mine = cache.get((w.scope, w.id))
        if mine is None:
            tz = ZoneInfo(w.timezone)
            mine = cache[(w.scope, w.id)] = window_spans(parse(w.cron), w.duration, tz, start, end)
        spans += mine
    return merge_spans(spans)


@lru_cache(maxsize=16)
def _buckets(start: float, end: float, by: Bucket, tz: tzinfo) -> list[tuple[float, float]]:
    """Every check of a report has the same buckets: cut once."""
    return bucket_spans(start, end, by, tz)


def report_of(
    stored: Stored,
    windows: Sequence[Window],
    start: float,
    end: float,
    by: Bucket | None,
    tz: tzinfo,
    now: float,
    region: str | None = None,
    cache: dict[tuple[str, str], list[tuple[float, float]]] | None = None,
) -> CheckReport:
    """One check's report (pure once the inputs are read)."""
    history, notes = history_of(stored, now)
    if region is not None:
        notes.append(REGION_NOTE)
        if region not in stored.regions:
            notes.append(f"{region!r} is not one of the check's regions now")
    segs = segments(history, region)
    spans = maintenance_of(windows, start, end, cache)
    if windows:
        notes.append("maintenance windows are applied as defined now, over the whole range")
    total = Period(account(segs, spans, start, end))
    buckets = (
        [Period(account(segs, spans, s, e)) for s, e in _buckets(start, end, by, tz)]
        if by is not None
        else []
    )
    return CheckReport(
        uid=stored.uid,
        tenant=stored.tenant,
        region=region,
        history_start=history.known_from,
        total=total,
        buckets=buckets,
        notes=notes,
    )


def uptime_reports(
    client: Any,
    keys: Keys,
    uids: Sequence[str],
    start: float,
    end: float,
    *,
    by: Bucket | None = None,
    tz: tzinfo = UTC,
    now: float,
    region: str | None = None,
) -> list[CheckReport]:
    """The reports of ``uids`` (existing checks only), in their order."""
    stored = read_stored(client, keys, uids)
    windows = read_windows(client, keys, list(stored.values()))
    reports = []
    cache: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for uid in uids:
        s = stored.get(uid)
        if s is None:
            continue
        mine = windows.get(maintenance_scope(uid=uid), []) + windows.get(
            maintenance_scope(tenant=s.tenant), []
        )
        reports.append(report_of(s, mine, start, end, by, tz, now, region, cache))
    return reports


def uptime_report(
    app: Any,
    uid: str | None = None,
    *,
    tenant: str | None = None,
    start: str | datetime,
    end: str | datetime,
    by: str | None = None,
    region: str | None = None,
    timezone: str | None = None,
) -> list[CheckReport]:
    """Uptime reports of check ``uid`` or of every check of ``tenant`` of ``app`` (its settings
    name the Redis; ``celery_app.app`` or one given to ``install``) over [start, end)
    (ISO 8601 or aware datetimes), cut ``by`` day, week or month in ``timezone`` (default
    UTC); with ``region``, that region's states instead of the check's quorum state.

    A bad argument raises CheckFieldError naming it; an unknown ``uid`` CheckNotFound; a
    partition count other than the store's PartitionLayoutError.
    """
    from celery_app.checks.layout import ensure_layout
    from celery_app.checks.store import CheckStore
    from celery_app.factory import settings_of
    from celery_app.wall_clock import clock_from_env

    lo, hi, bucket, tz = validate_request(
        uid=uid, tenant=tenant, start=start, end=end, by=by, timezone=timezone
    )
    if region is not None and not is_id(region):
        raise CheckFieldError("region", f"{region!r} is not allowed: use {ID_RULE}")
    store = CheckStore.from_settings(settings_of(app))
    # a store built with another partition count would read other keys: refused, by name
    ensure_layout(store.redis, store.keys, record=False)
    uids = [uid] if uid is not None else store.uids(tenant)
    now = clock_from_env().now().timestamp()
    reports = uptime_reports(
        store.redis, store.keys, uids, lo, hi, by=bucket, tz=tz, now=now, region=region
    )
    if uid is not None and not reports:
        raise CheckNotFound(uid)
    return reports


def report_rows(reports: Sequence[CheckReport]) -> list[dict[str, Any]]:
    """Flat rows (one per check and period, ``period`` = ``total`` or ``bucket``) for CSV."""
    rows = []
    for r in reports:
        for kind, periods in (("total", [r.total]), ("bucket", r.buckets)):
            for p in periods:
                rows.append(
                    {"uid": r.uid, "tenant": r.tenant, "region": r.region or "", "period": kind}
                    | p.as_dict()
                )
    return rows


def duration_text(seconds: float | None) -> str:
    """``3d 4h 05m 06s`` style (``-`` for None)."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    text = str(timedelta(seconds=rest))
    return f"{days}d {text}" if days else text
