"""Finishing runs in tests through the write production makes (``completion.CompleteCall``,
complete.lua), for tests that finish runs of many jobs without a worker.

``finish``: one run of a leased job, as ``workers.post_exec.record_outcome`` writes a run it has
no start read for (a killed run; or after its planned write was refused as stale):
``finish_run_with_health`` with the worker's ``health_of`` (its HealthPlanner and the refill's
reads on the job's round trip), so the check's state moves with the run as on a worker.
``write``: runs already folded (``CompletedRun``), in one round trip, as the reaper writes the
runs it finds lost (``complete_runs_each``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from celery_app.checks.check_state import HealthPlanner, result_state
from celery_app.checks.completion import complete_runs_each, finish_run_with_health
from celery_app.checks.dispatch import RefillNeeds
from celery_app.checks.jobs import DEFAULT_RESULTS_MAXLEN, CompletedRun
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.factory import params_of
from celery_app.redis.schema import by_partition, split_job_id
from workers.refill_prefetch import HealthWithRefillNeeds


def finish(
    client,
    keys,
    settings,
    job_id: str,
    lease_token: str,
    *,
    params=None,
    duration_ms: float = 5.0,
    timed_out: bool = False,
    exec_start: datetime | None = None,
    now: datetime | None = None,
    record: RunRecord | None = None,
    scheduled_at: float | None = None,
    ok: bool | None = None,
) -> tuple[bool, str | None]:
    """Finish one run of ``job_id`` (leased with ``lease_token``): (written, the id of the
    transition it made or None). ``ok``: whether the run points up, by default ``record``'s
    status (else: not timed out), as the worker's ``result_state``; ``now`` by default Redis's
    time; ``params`` by default the settings'."""
    if ok is None:
        ok = record.status == RunStatus.UP if record is not None else not timed_out
    keys = keys.of_job(job_id)  # the job's partition, as the worker's (``post_exec``)
    planner = HealthPlanner(client, keys, settings, result_state(ok, record))
    needs = RefillNeeds(keys, split_job_id(job_id)[1])
    return finish_run_with_health(
        client,
        keys,
        params if params is not None else params_of(settings),
        job_id,
        lease_token,
        duration_ms=duration_ms,
        timed_out=timed_out,
        exec_start=exec_start,
        now=now,
        record=record,
        scheduled_at=scheduled_at,
        results_maxlen=settings.results_history,
        health_of=HealthWithRefillNeeds(planner, needs),
    )


def write(
    client, keys, runs: Sequence[CompletedRun], *, results_maxlen: int = DEFAULT_RESULTS_MAXLEN
) -> list[bool]:
    """Write ``runs`` in one round trip per partition of the check half (the reaper's are of
    its own): for each, whether its lease was still held (a script error is raised)."""
    written: dict[int, bool] = {}
    for group in by_partition(keys, list(enumerate(runs)), lambda each: each[1].job_id):
        if not group:
            continue
        part = keys.of_job(group[0][1].job_id)
        replies = complete_runs_each(
            client, part, [run for _i, run in group], results_maxlen=results_maxlen
        )
        for (i, _run), reply in zip(group, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            written[i] = reply[0]
    return [written[i] for i in range(len(runs))]
