"""What a running checkbeat is doing, read from Redis in a few round trips.

One collector serves three faces: the live view of ``checkbeat up``, ``checkbeat status`` and
``checkbeat status --json``. Lanes show what runs (leases in flight), what Celery holds (the
broker queue) and what waits in Redis in fair order (the ready index); checks show their lane,
cost EWMA, last result and next run, and their state (up / degraded / down, per region too) with
the newest transitions; cron tasks their next and last runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from celery import Celery

from celery_app.checks.check_state import read_tenant_transitions
from celery_app.checks.jobs import UnreadableJob, read_jobs_for_report
from celery_app.checks.store import CheckStore
from celery_app.checks.transitions import pending
from celery_app.cron_tasks.service import CronService, row_dict
from celery_app.factory import settings_of
from celery_app.local.lateness import LatenessWindow, scrape, summary
from celery_app.metrics import endpoints
from celery_app.metrics.server import Credentials
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import LANE_NAMES, CheckStateField, CronStateField, Keys, check_queue

ENV_FILE = "env.json"


def write_env_file(data_dir: Path, env: Mapping[str, str]) -> Path:
    """Record the connection settings ``up`` runs with, so ``status`` finds the same Redis."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / ENV_FILE
    wanted = {k: v for k, v in env.items() if k.startswith("CHECKBEAT_")}
    path.write_text(json.dumps(wanted, indent=2))
    path.chmod(0o600)  # it may hold a Redis password
    return path


def load_env_file(data_dir: Path) -> bool:
    """Adopt the settings of a ``checkbeat up`` started from ``data_dir`` (unless set already)."""
    path = data_dir / ENV_FILE
    if not path.exists():
        return False
    for key, value in json.loads(path.read_text()).items():
        os.environ.setdefault(key, value)
    return True


def _iso(ts: float | None) -> str | None:
    if not ts:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _lanes(app: Celery, keys: Keys, regions: list[str]) -> list[dict[str, Any]]:
    settings = settings_of(app)
    state = get_redis(settings.redis_url, settings)
    broker = get_redis(settings.effective_broker_url, settings)
    pipe = state.pipeline(transaction=False)
    bpipe = broker.pipeline(transaction=False)
    cells = [(region, lane) for region in regions for lane in range(len(LANE_NAMES))]
    for region, lane in cells:
        pipe.zcard(keys.leases(region, lane))
        pipe.zcard(keys.ready(region, lane))
        bpipe.llen(check_queue(region, lane))
    counts = pipe.execute()
    queued = bpipe.execute()
    return [
        {
            "region": region,
            "lane": LANE_NAMES[lane],
            "running": counts[2 * i],
            "waiting": counts[2 * i + 1],
            "queued": queued[i],
        }
        for i, (region, lane) in enumerate(cells)
    ]


def _checks(app: Celery, keys: Keys) -> list[dict[str, Any]]:
    settings = settings_of(app)
    client = get_redis(settings.redis_url, settings)
    definitions = CheckStore.from_settings(settings).list()
    job_ids = [job for d in definitions for job in d.job_ids()]
    jobs = read_jobs_for_report(client, keys, job_ids)
    pipe = client.pipeline(transaction=False)
    for d in definitions:
        pipe.hgetall(keys.last_result(d.uid))
    last = dict(zip((d.uid for d in definitions), pipe.execute(), strict=True))
    rows = []
    for job in jobs:
        if job is None or isinstance(job, UnreadableJob):  # `checks diagnose` lists those
            continue
        result = json.loads(last.get(job.uid, {}).get(job.region) or "null") or {}
        rows.append(
            {
                "uid": job.uid,
                "tenant": job.tenant,
                "region": job.region,
                "lane": LANE_NAMES[job.lane],
                "cost_ewma_ms": round(job.cost_ewma_ms, 1),
                "delay_ewma_ms": round(job.delay_ewma_ms, 1),
                "runs": job.runs,
                "last_status": result.get("status"),
                "last_latency_ms": result.get("latency_ms"),
                "last_error": result.get("error_class"),
                "next_run": None if not job.enabled else _iso(job.scheduled_at),
                "running": bool(job.lease_token),
                "region_state": str(job.health.state),
            }
        )
    return rows


def _time(stored: str | None) -> str | None:
    """A stored Unix time as ISO 8601 (None when absent)."""
    return _iso(float(stored)) if stored else None


#: Transitions the status shows (newest first, all tenants).
RECENT_TRANSITIONS = 10


def _states(app: Celery, keys: Keys) -> dict[str, Any]:
    """Each check's state (and its regions'), and the newest transitions of every tenant."""
    settings = settings_of(app)
    client = get_redis(settings.redis_url, settings)
    definitions = CheckStore.from_settings(settings).list()
    pipe = client.pipeline(transaction=False)
    for d in definitions:
        pipe.hgetall(keys.check_state(d.uid))
    states = []
    for d, h in zip(definitions, pipe.execute(), strict=True):
        states.append(
            {
                "uid": d.uid,
                "tenant": d.tenant,
                "state": h.get(CheckStateField.STATE) or "up",
                "observed": h.get(CheckStateField.OBSERVED) or h.get(CheckStateField.STATE) or "up",
                "since": _iso(float(h[CheckStateField.SINCE]))
                if h.get(CheckStateField.SINCE)
                else None,
                "transitions": int(h.get(CheckStateField.SEQ) or 0),
                "held_until": _iso(float(h[CheckStateField.HELD_UNTIL]))
                if h.get(CheckStateField.HELD_UNTIL)
                else None,
            }
        )
    recent = [
        t
        for tenant in sorted({d.tenant for d in definitions})
        for t in read_tenant_transitions(client, keys, tenant, RECENT_TRANSITIONS)
    ]
    recent.sort(key=lambda t: t["at"], reverse=True)
    transitions = [
        {
            "id": t["id"],
            "uid": t["uid"],
            "tenant": t["tenant"],
            "from": t["from"],
            "to": t["to"],
            "at": _iso(t["at"]),
            "held": bool(t.get("held")),
        }
        for t in recent[:RECENT_TRANSITIONS]
    ]
    return {
        "states": states,
        "transitions": transitions,
        "undelivered": pending(client, keys),
    }


def _cron(app: Celery) -> list[dict[str, Any]]:
    """One row per cron task; per-tenant tasks also list each tenant's last run."""
    service = CronService(app)
    tenants = service.tenants.read() if service.tenants else []
    pairs = [(t.id, tenant) for t in service.tasks.values() if t.per_tenant for tenant in tenants]
    states = service.store.states(pairs)
    rows = []
    for row in service.rows():
        data = row_dict(row)
        if service.tasks[row.id].per_tenant:
            data["tenants"] = {
                tenant: {
                    "last_start": _time(s.get(CronStateField.LAST_START)),
                    "last_end": _time(s.get(CronStateField.LAST_END)),
                    "last_outcome": s.get(CronStateField.OUTCOME),
                    "last_error": s.get(CronStateField.LAST_ERROR),
                }
                for (task_id, tenant), s in states.items()
                if task_id == row.id
            }
        rows.append(data)
    return rows


def _metrics(app: Celery, keys: Keys) -> list[dict[str, Any]]:
    """Every live metrics endpoint (beat's and the workers'), with the URLs to scrape."""
    settings = settings_of(app)
    rows = []
    for entry in endpoints.endpoints(get_redis(settings.redis_url, settings), keys):
        row = {**entry, "metrics": entry["url"] + "/metrics", "healthz": entry["url"] + "/healthz"}
        if entry.get("role") == "beat":
            row["checks"] = entry["url"] + "/metrics/checks?page=0"
        row["at"] = _iso(entry.get("at"))
        rows.append(row)
    return rows


def collect_status(app: Celery, lateness: LatenessWindow | None = None) -> dict[str, Any]:
    """Everything the view shows, as plain JSON-able data. Start lateness is read from the
    workers' histograms: over ``lateness``'s window, or since they started."""
    settings = settings_of(app)
    keys = state_keys(settings)
    metrics = _metrics(app, keys)
    workers = [m["metrics"] for m in metrics if m.get("role") == "worker"]
    credentials = Credentials.of(settings)
    auth = credentials.authorization() if credentials is not None else None
    late = (
        lateness.read(workers, authorization=auth)
        if lateness is not None
        else summary(scrape(workers, authorization=auth))
    )
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "regions": list(settings.regions),
        "lanes": _lanes(app, keys, list(settings.regions)),
        "checks": _checks(app, keys),
        **_states(app, keys),
        "cron": _cron(app),
        "metrics": metrics,
        "lateness": late,
    }
