"""The ``checkbeat.run_check`` task: load the job and its check, run the probe, hand back the
outcome. The post-exec signal handler (:mod:`workers.post_exec`) writes it back.

Why the write is not in the task: a hard time limit kills the pool process before the task can
write anything, and Celery then reports the run only through ``task_failure`` in the main
process. Putting the single write in the signal handlers gives every path (success, probe
failure, soft limit, hard limit) the same one Lua call, idempotent per lease token. A run that
raises is handled there too (``task_failure``): before its probe (:func:`run_start.probing`) its
lease is released and its job placed at its next tick at once, after it the run is recorded.
"""

from __future__ import annotations

import logging
import math
import time
from enum import StrEnum
from typing import Any

from celery import shared_task
from celery.exceptions import Reject

from celery_app.checks.jobs import JobState, ReadGuard
from celery_app.checks.kinds import get_kind
from celery_app.checks.quarantine import DATA_ERRORS, quarantine
from celery_app.checks.run_contract import (
    RUN_CHECK_TASK,
    BadRunMessage,
    RunRequest,
    max_timeout_s,
)
from celery_app.checks.start_read import read_start
from celery_app.errors import CheckFieldError
from celery_app.factory import params_of, settings_of
from celery_app.redis.client import get_redis
from celery_app.redis.clock import server_time
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import JobField, QuarantineStep
from celery_app.registry import registry_of
from scheduling_core.on_tick import tick_wait
from workers import (
    post_exec,  # noqa: F401 - connects the post-exec signal handlers
    run_start,
)
from workers.outcome import RunOutcome
from workers.probes.result import ProbeContext, ProbeResult
from workers.run_start import RunStart
from workers.runner import run_probe
from workers.target_guard import AddressPolicy

log = logging.getLogger(__name__)


class Discarded(StrEnum):
    """Why a well-formed run message was dropped without probing (the task's return value)."""

    CHECK_DELETED = "its check was deleted"
    LEASE_GONE = "its lease was reaped or replaced"
    DUPLICATE = "a run of the same lease already started (a duplicated delivery)"


#: How long a run's started marker outlives the run's deadline: longer than any post-exec write,
#: shorter than memory should hold it. A copy delivered later finds the lease gone anyway.
STARTED_MARKER_MARGIN_S = 60


@shared_task(
    name=RUN_CHECK_TASK,
    bind=True,
    acks_late=True,
    acks_on_failure_or_timeout=True,  # a killed run is reaped and rescheduled, never redelivered
    reject_on_worker_lost=False,
    ignore_result=True,
)
def run_check(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one claimed job (kwargs: a ``run_contract.RunRequest``). A malformed message or an
    unknown job is rejected; a stale one is dropped. Returns a summary of the outcome (for the
    log and Flower); the outcome itself goes to the post-exec write in this thread."""
    settings = settings_of(self.app)
    ceiling_s = max_timeout_s(params_of(settings))
    try:
        if args:
            raise BadRunMessage("takes keyword arguments only")
        request = RunRequest.parse(kwargs, max_timeout_s=ceiling_s)
    except BadRunMessage as exc:
        log.error("checkbeat: rejected run_check message %s: %s", self.request.id, exc)
        raise Reject(f"bad run_check message: {exc}", requeue=False) from None

    client = get_redis(settings.redis_url, settings)
    keys = state_keys(settings).of_job(request.job_id)
    read = read_start(
        client,
        keys,
        request.job_id,
        request.uid,
        request.lease_token,
        self.request.id or "1",
        math.ceil((request.timeout_s + settings.dispatch_lead + STARTED_MARKER_MARGIN_S) * 1000),
    )
    read_at = time.perf_counter()
    job_hash, first_delivery = read.job_hash, read.first_delivery
    if not job_hash:
        log.error(
            "checkbeat: rejected run_check %s: unknown job %s", self.request.id, request.job_id
        )
        raise Reject(f"unknown job id {request.job_id!r}", requeue=False)
    try:
        job = JobState.from_hash(request.job_id, job_hash)
    except DATA_ERRORS as exc:  # a torn job hash: set aside, the slot freed
        if job_hash.get(JobField.LEASE_TOKEN) == request.lease_token:
            quarantine(client, keys, request.job_id, QuarantineStep.RUN, exc, server_time(client))
        return {"discarded": f"its job cannot be read ({exc})"}
    if job.lease_token != request.lease_token or not read.check_exists or not first_delivery:
        if not read.check_exists:
            why = Discarded.CHECK_DELETED
        elif job.lease_token != request.lease_token:
            why = Discarded.LEASE_GONE
        else:
            why = Discarded.DUPLICATE
        log.warning("checkbeat: dropped run of %s: %s", request.job_id, why)
        return {"discarded": str(why)}

    run_start.keep(
        RunStart(
            self.request.id,
            job,
            ReadGuard.of(job_hash, read.maintenance_version),
            read.server_now,
            read_at,
        )
    )
    check = read.probe()
    context = ProbeContext(
        timeout_s=request.timeout_s,
        policy=AddressPolicy.from_settings(settings),
        region=request.region,
        tls_ca_file=settings.probe_tls_ca_file,
    )
    wait_s = tick_wait(request.scheduled_at, read.server_now, time.perf_counter() - read_at)
    if wait_s > 0:
        time.sleep(wait_s)  # claimed within the dispatch lead: this slot is already ours
    secrets = read.secrets()
    started_at = run_start.probing(self.request.id, secrets).started_at  # raising now records
    try:
        probe = get_kind(registry_of(self.app), check.kind).probe
    except CheckFieldError as exc:
        result, duration_ms = ProbeResult.down("error", str(exc), 0.0), 0.0
    else:
        result, duration_ms = run_probe(probe, check.target, check.config, context)
    outcome = RunOutcome.of_probe(
        request,
        result,
        duration_ms=duration_ms,
        started_at=started_at,
        finished_at=time.time(),
        worker=self.request.hostname or "",
        queue=(self.request.delivery_info or {}).get("routing_key") or "",
        secrets=secrets,
    )
    run_start.finish(self.request.id, outcome)  # the post-exec write takes it (workers.post_exec)
    return outcome.summary()
