"""Post-exec accounting: fold each run into the job with ``Params.post_exec`` in one Lua call.

Signals:

- ``task_postrun`` (pool process, every run that returned): the outcome the task returned.
- ``task_failure`` with ``TimeLimitExceeded`` or ``WorkerLostError`` (main process): the hard
  limit killed the run, or its process died; recorded as a timeout of unknown start.
- ``task_failure`` with any other exception (the thread that ran the task): the task raised.
  Before its probe started (``run_start.probing``) the run is abandoned: its lease released
  and its job placed at its next tick at once (:func:`abandon`), not left to the reaper; after
  it, the run is recorded (the outcome it built, else an error naming the exception).

Celery 5.7 sends ``task_failure`` twice for one hard time limit: ``Request.on_timeout`` fires it
(since celery/celery#10226), then the pool's ``on_failure`` for the same ``TimeLimitExceeded``
(seen in tests/test_worker_kills.py). A killed run has no start read to plan from: its write is
:func:`celery_app.checks.completion.finish_run_with_health`, which reads the job again, and its
``complete.lua`` call checks the lease token and removes it, so the second call (and a reaper
that got there first) writes nothing: idempotent per lease token.

The write of a run that returned (or raised after its probe) is planned from its start read
(``workers.run_start``) and made with the hand-off of the freed slot in one round trip
(:func:`celery_app.checks.completion.complete_as_read`); when the job changed since that read,
or the maintenance windows since the version it was planned with and the run counts the
check's state, nothing is written and it is made as a killed run's is.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.signals import task_failure, task_postrun

from celery_app.checks.abandon import Abandoned, AbandonReason, abandon_run
from celery_app.checks.check_state import HealthPlanner, result_state
from celery_app.checks.claiming import Claim
from celery_app.checks.completion import (
    Completed,
    Handoff,
    complete_as_read,
    finish_run_with_health,
)
from celery_app.checks.dispatch import RefillNeeds, publish_claims, refill_after_run
from celery_app.checks.jobs import from_unix, lease_is_current, plan_completion
from celery_app.checks.quarantine import DATA_ERRORS, quarantine
from celery_app.checks.run_contract import (
    RUN_CHECK_TASK,
    BadRunMessage,
    RunRequest,
    RunStatus,
    lease_seconds,
    max_timeout_s,
)
from celery_app.checks.transitions import claim_and_publish
from celery_app.factory import params_of, settings_of
from celery_app.metrics import record as metrics
from celery_app.redis.client import get_redis
from celery_app.redis.clock import server_time
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import Keys, QuarantineStep, check_queue, split_job_id
from scheduling_core import LANE_FAST, LANE_SLOW, Params
from workers import run_start
from workers.outcome import RunOutcome
from workers.probes.result import ProbeResult
from workers.refill_prefetch import HealthWithRefillNeeds
from workers.roles import slots_known_live
from workers.run_start import ProbeStart, RunStart

log = logging.getLogger(__name__)


def record_outcome(app: Celery, outcome: RunOutcome, start: RunStart | None = None) -> bool:
    """Write one outcome back (EWMAs, lane, deadline, lease, next tick, history, the check's
    state), publish the transition it made if any, then refill the slot it freed at once
    (work-conserving) rather than at beat's next tick.

    Both schedule on Redis's time, never this worker's clock (which may be off beat's): the
    next tick, what is due, lease expiries. Only ``started_at`` (delay telemetry) is ours.
    ``start``: what the run read when it started (:mod:`workers.run_start`); the write is then
    planned from it, in one round trip, unless the job or the maintenance windows changed.

    False when the lease is no longer this run's (reaped, deleted, already recorded).
    """
    settings = settings_of(app)
    client = get_redis(settings.redis_url, settings)
    keys = state_keys(settings).of_job(outcome.job_id)  # the job's partition: every key below
    region = split_job_id(outcome.job_id)[1]
    needs = RefillNeeds(keys, region)  # read with the job: no round trip of the refill's own
    planner = HealthPlanner(
        client, keys, settings, result_state(outcome.status == RunStatus.UP, outcome)
    )
    params = params_of(settings)
    handed: Claim | None = None
    try:
        done = None
        if start is not None and outcome.worker:
            handoff = Handoff(
                outcome.worker,
                region,
                lease_seconds(params, settings.lease_margin),
                lease_lane=_lane_of(outcome.queue, region),
                now=start.now(),  # the write is planned at this time too
                live=slots_known_live(outcome.worker),
            )
            completed = _write_as_read(
                client, keys, params, settings.results_history, outcome, start, planner, handoff
            )
            if completed is not None:
                done = completed.written, completed.transition
                if completed.written:
                    needs.prefetched(completed.refill_needs)
                    handed = _handed(client, keys, handoff, completed.handed)
        if done is None:
            done = finish_run_with_health(
                client,
                keys,
                params,
                outcome.job_id,
                outcome.lease_token,
                duration_ms=outcome.duration_ms,
                timed_out=outcome.timed_out,
                exec_start=_exec_start(outcome),
                record=outcome.record(),
                scheduled_at=outcome.scheduled_at,
                results_maxlen=settings.results_history,
                health_of=HealthWithRefillNeeds(planner, needs),
            )
        written, transition = done
    except DATA_ERRORS as exc:
        # The job's own numbers cannot be folded or placed: set it aside; the slot is free.
        if lease_is_current(client, keys, outcome.job_id, outcome.lease_token):
            step = QuarantineStep.POST_EXEC
            quarantine(client, keys, outcome.job_id, step, exc, server_time(client))
        refill(app, region, partition=keys.partition)
        return False
    metrics.check_run(outcome, written)
    if transition is not None:
        publish_transition(app, transition)
    if handed is not None:
        publish_handed(app, handed)
    elif written:
        refill(app, region, needs if needs.replies is not None else None, keys.partition)
    else:
        log.info(
            "checkbeat: run of %s not recorded: its lease is gone (reaped, deleted or done)",
            outcome.job_id,
        )
    return written


def _exec_start(outcome: RunOutcome) -> datetime | None:
    return datetime.fromtimestamp(outcome.started_at, UTC) if outcome.started_at else None


def _write_as_read(
    client: Any,
    keys: Keys,
    params: Params,
    results_maxlen: int,
    outcome: RunOutcome,
    start: RunStart,
    planner: HealthPlanner,
    handoff: Handoff,
) -> Completed | None:
    """The write planned from the run's start read, with the hand-off of the freed slot, in
    one round trip; None when the job changed since, or the maintenance windows and the run
    counts the check's state (nothing was written)."""
    planner.version = start.guard.maintenance_version or None  # '' = never written
    run = plan_completion(
        params,
        start.job,
        outcome.lease_token,
        now=from_unix(handoff.now),
        duration_ms=outcome.duration_ms,
        timed_out=outcome.timed_out,
        exec_start=_exec_start(outcome),
        record=outcome.record(),
        scheduled_at=outcome.scheduled_at,
        health_of=planner,
    )
    return complete_as_read(client, keys, run, start.guard, handoff, results_maxlen=results_maxlen)


def _lane_of(queue: str, region: str) -> int | None:
    """The lane of the check queue a run came from (its lease is in that lane's index)."""
    for lane in (LANE_FAST, LANE_SLOW):
        if queue == check_queue(region, lane):
            return lane
    return None


def _handed(client: Any, keys: Keys, handoff: Handoff, line: str) -> Claim | None:
    """The claim of the job handed the freed slot; one whose stored numbers a run cannot
    carry is quarantined (its lease with it), as a claim's would be."""
    try:
        return handoff.claim_of(line)
    except ValueError as exc:
        job = line.split(" ", 1)[0]
        quarantine(client, keys, job, QuarantineStep.CLAIM, exc, server_time(client))
        return None


def publish_transition(app: Celery, transition_id: str) -> None:
    """Publish the transition this run made, at once (claimed first: a beat sweeping the outbox
    may have taken it already); on failure beat's next sweep publishes it."""
    settings = settings_of(app)
    client = get_redis(settings.redis_url, settings)
    try:
        keys = state_keys(settings).of_transition(transition_id)
        claim_and_publish(app, client, keys, settings, server_time(client), [transition_id])
    except Exception:
        log.exception("checkbeat: publishing transition %s failed; beat retries", transition_id)


def publish_handed(app: Celery, claim: Claim) -> None:
    """Publish the run of the job this run handed its slot. On failure its claim is released
    back to the ready index (:meth:`Dispatcher.publish`), as any claim whose message could not
    be sent; if the release fails too, the reaper takes the lease back."""
    try:
        publish_claims(app, [claim])
    except Exception:
        log.exception("checkbeat: publishing the run of %s failed; released", claim.job_id)


def refill(app: Celery, region: str, needs: RefillNeeds | None = None, partition: int = 0) -> None:
    """Claim and publish work for the slot just freed in ``partition`` (the dispatcher's own
    atomic claim)."""
    try:
        refill_after_run(app, region, needs=needs, partition=partition)
    except Exception:  # beat's next tick claims anyway
        log.exception("checkbeat: refilling the freed slot of region %s failed", region)


@task_postrun.connect
def _after_run(sender: Any = None, task: Any = None, task_id: Any = None, **_: Any) -> None:
    task = task or sender
    if getattr(task, "name", None) != RUN_CHECK_TASK:
        return
    start, outcome = run_start.take(task_id)
    if outcome is None:
        return  # rejected, discarded, or raised (handled by _after_raise): nothing to write
    try:
        record_outcome(task.app, outcome, start)
    except Exception:  # never take the worker down; the lease reaper will catch up
        log.exception("checkbeat: post-exec write of %s failed", outcome.job_id)


@task_failure.connect
def _after_kill(
    sender: Any = None, exception: BaseException | None = None, kwargs: Any = None, **_: Any
) -> None:
    if getattr(sender, "name", None) != RUN_CHECK_TASK:
        return
    if not isinstance(exception, TimeLimitExceeded | WorkerLostError):
        return  # the task raised: _after_raise
    params = params_of(settings_of(sender.app))
    try:
        request = RunRequest.parse(kwargs, max_timeout_s=max_timeout_s(params))
    except BadRunMessage:
        return
    if isinstance(exception, TimeLimitExceeded):
        limit = exception.args[0] if exception.args else request.timeout_s
        limit_s = float(limit) if isinstance(limit, int | float) else request.timeout_s
        reason = f"hard time limit ({limit_s:g} s) exceeded: the probe was killed"
    else:
        limit_s = request.timeout_s
        reason = f"the worker process running the probe was lost: {exception}"
    worker = getattr(getattr(sender, "request", None), "hostname", None) or ""
    outcome = RunOutcome.killed(
        request, reason=reason, limit_s=limit_s, worker=worker, now=time.time()
    )
    try:
        record_outcome(sender.app, outcome)
    except Exception:
        log.exception("checkbeat: post-exec write of killed run %s failed", request.job_id)


def abandon(
    app: Celery, request: RunRequest, exc: BaseException, task_id: str, *, read: bool
) -> None:
    """A run that raised before its probe: release its lease and place its job at its next tick
    now (``checks.abandon``), log one line, count it, refill the freed slot. ``read``: its start
    read found the lease its own (else that read failed). If this fails too (Redis still
    unreachable), the lease is left to the reaper, which records the run as lost."""
    reason = AbandonReason.BEFORE_PROBE if read else AbandonReason.START_READ
    raised = f"{type(exc).__name__}: {exc}"
    try:
        settings = settings_of(app)
        client = get_redis(settings.redis_url, settings)
        done = abandon_run(
            client,
            state_keys(settings).of_job(request.job_id),
            params_of(settings),
            request.job_id,
            request.lease_token,
            task_id,
            scheduled_at=request.scheduled_at,
        )
    except Exception as error:
        log.error(
            "checkbeat: run of %s raised before its probe (%s, %s); releasing its lease failed "
            "(%s): the reaper takes it back",
            request.job_id, raised, reason, error,
        )  # fmt: skip
        return
    if done.result != Abandoned.RELEASED:
        log.warning(
            "checkbeat: run of %s raised before its probe (%s, %s); lease not released: %s",
            request.job_id, raised, reason, done.result,
        )  # fmt: skip
        return
    next_at = datetime.fromtimestamp(done.next_scheduled_at or 0.0, UTC).isoformat()
    log.warning(
        "checkbeat: run of %s raised before its probe (%s, %s): lease released, its tick %s lost, "
        "next tick %s",
        request.job_id, raised, reason, _iso(request.scheduled_at), next_at,
    )  # fmt: skip
    metrics.run_abandoned(request.job_id, done.lane, str(reason))
    partition = state_keys(settings_of(app)).of_job(request.job_id).partition
    refill(app, split_job_id(request.job_id)[1], partition=partition)


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat()


def raised_after_probe(
    request: RunRequest, exc: BaseException, probe: ProbeStart, *, worker: str, queue: str
) -> RunOutcome:
    """The outcome of a run whose probe ran but which raised before handing its outcome over
    (building it, scrubbing it): an error naming the exception, scrubbed of the check's
    secrets like any result."""
    elapsed = probe.elapsed_ms()
    result = ProbeResult.down(
        "error", f"the run failed after its probe: {type(exc).__name__}: {exc}", elapsed
    )
    return RunOutcome.of_probe(
        request,
        result,
        duration_ms=elapsed,
        started_at=probe.started_at,
        finished_at=time.time(),
        worker=worker,
        queue=queue,
        secrets=probe.secrets,
    )


@task_failure.connect
def _after_raise(
    sender: Any = None,
    task_id: Any = None,
    exception: BaseException | None = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    """The run task raised (in the thread that ran it; a kill is :func:`_after_kill`'s)."""
    if getattr(sender, "name", None) != RUN_CHECK_TASK or exception is None:
        return
    if isinstance(exception, TimeLimitExceeded | WorkerLostError):
        return
    try:
        request = RunRequest.parse(
            kwargs, max_timeout_s=max_timeout_s(params_of(settings_of(sender.app)))
        )
    except BadRunMessage:
        return  # rejected before anything was read
    probe = run_start.probe_started(task_id)
    start, outcome = run_start.take(task_id)
    task_request = getattr(sender, "request", None)
    if outcome is None and probe is not None:
        worker = getattr(task_request, "hostname", None) or ""
        queue = (getattr(task_request, "delivery_info", None) or {}).get("routing_key") or ""
        outcome = raised_after_probe(request, exception, probe, worker=worker, queue=queue)
    if outcome is None:
        abandon(sender.app, request, exception, task_id or "", read=start is not None)
        return
    log.warning(
        "checkbeat: run of %s raised after its probe (%s: %s); recording it",
        request.job_id, type(exception).__name__, exception,
    )  # fmt: skip
    try:
        record_outcome(sender.app, outcome, start)
    except Exception:
        log.exception("checkbeat: post-exec write of %s failed", request.job_id)
