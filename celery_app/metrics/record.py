"""The one-line hooks: each takes what its caller already has and updates the series.

Why functions and not metric calls at the hook points: the hook sites (scheduler, dispatcher,
post-exec, cron recording) are shared files edited in parallel; one call each keeps them small,
and a metrics failure is contained here (never raised into a tick or a run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from celery_app.metrics import definitions as m
from celery_app.redis.schema import LANE_NAMES, CronSkipReason, split_job_id

log = logging.getLogger(__name__)

#: Attribute a cron run's request carries from prerun to postrun (monotonic start).
CRON_STARTED_ATTR = "checkbeat_cron_started"


def _lane(value: Any) -> str:
    if isinstance(value, int) and 0 <= value < len(LANE_NAMES):
        return LANE_NAMES[value]
    return str(value) if value in LANE_NAMES else "unknown"


@contextmanager
def _guard(what: str) -> Iterator[None]:
    """A metrics failure is logged, never raised into a tick or a run."""
    try:
        yield
    except Exception as exc:
        log.warning("metrics: could not record %s: %s", what, exc)


# --- beat -------------------------------------------------------------------------------------
def beat_tick(started: float) -> None:
    """A tick finished (``started``: its ``time.perf_counter()``)."""
    m.BEAT_TICK_DURATION.observe(time.perf_counter() - started)
    m.BEAT_LAST_TICK.set(time.time())


def beat_tick_failed() -> None:
    m.BEAT_TICK_FAILURES.inc()


def cron_tick(report: Any) -> None:
    """A cron engine ``TickReport``: fired and skipped windows per task."""
    with _guard("a cron tick"):
        for fired in report.fired:
            m.CRON_FIRED.labels(fired.task_id).inc()
        for skipped in report.skipped:
            m.CRON_SKIPPED.labels(skipped.task_id, str(skipped.reason)).inc()
            if skipped.reason == CronSkipReason.MISSED:
                m.CRON_MISSED.labels(skipped.task_id).inc()


def cron_takeover(taken: Any) -> None:
    """A ``Takeover``: claims published for a beat that never confirmed them, and lost ones."""
    with _guard("a takeover"):
        if taken.published:
            m.CRON_TAKEOVERS.labels("published").inc(len(taken.published))
        if taken.lost:
            m.CRON_TAKEOVERS.labels("lost").inc(len(taken.lost))


# --- dispatch ---------------------------------------------------------------------------------
def promoted(placed: Mapping[tuple[str, int], int]) -> None:
    """Count the jobs a promote put in each (region, lane) ready index."""
    for (region, lane), count in placed.items():
        if count:
            m.DISPATCH_PROMOTED.labels(region, _lane(lane)).inc(count)


def _per_lane(counter: Any, claims: Iterable[Any]) -> None:
    counts: dict[tuple[str, str], int] = {}
    for claim in claims:
        key = (claim.region, _lane(claim.lane))
        counts[key] = counts.get(key, 0) + 1
    for (region, lane), count in counts.items():
        counter.labels(region, lane).inc(count)


def claimed(region: str, taken: Any) -> None:
    """One region's claim (``claims``, ``rate_limited``)."""
    with _guard("claims"):
        _per_lane(m.DISPATCH_CLAIMED, taken.claims)
        if taken.rate_limited:
            m.DISPATCH_RATE_LIMITED.labels(region).inc(taken.rate_limited)


def published(claims: Iterable[Any]) -> None:
    with _guard("publishes"):
        _per_lane(m.DISPATCH_PUBLISHED, claims)


def released(claims: Iterable[Any]) -> None:
    with _guard("releases"):
        _per_lane(m.DISPATCH_RELEASED, claims)


def reaped(runs: Iterable[Any], done: Iterable[Any]) -> None:
    """Reaped ``CompletedRun`` s (their record has region and lane), counting those written."""
    with _guard("reaped leases"):
        counts: dict[tuple[str, str], int] = {}
        for run, written in zip(runs, done, strict=False):
            if written:
                key = (run.record.region, _lane(run.record.lane))
                counts[key] = counts.get(key, 0) + 1
        for (region, lane), count in counts.items():
            m.DISPATCH_REAPED.labels(region, lane).inc(count)


# --- check runs -------------------------------------------------------------------------------
def check_run(outcome: Any, written: bool) -> None:
    """One ``RunOutcome`` written back (or not: its lease was gone)."""
    with _guard("a check run"):
        region = split_job_id(outcome.job_id)[1]
        parts = (outcome.queue or "").split(".")
        lane = _lane(parts[-1]) if len(parts) == 3 else "unknown"
        if not written:
            m.RUN_LEASE_GONE.labels(region, lane).inc()
            return
        m.RUNS.labels(region, lane, str(outcome.status)).inc()
        if outcome.timed_out:
            m.RUN_TIMEOUTS.labels(region, lane).inc()
        if outcome.started_at:
            lateness = max(0.0, outcome.started_at - outcome.scheduled_at)
            m.RUN_LATENESS.labels(region, lane).observe(lateness)
        m.RUN_DURATION.labels(region, lane).observe(max(0.0, outcome.duration_ms) / 1000.0)


def run_abandoned(job_id: str, lane: Any, reason: str) -> None:
    """A run that raised before its probe, its lease released (``lane``: the job's, claimed)."""
    with _guard("an abandoned run"):
        m.RUNS_ABANDONED.labels(split_job_id(job_id)[1], _lane(lane), reason).inc()


# --- cron runs --------------------------------------------------------------------------------
def cron_run_started(request: Any, task_id: str, first: bool) -> None:
    """The prerun of a cron delivery: its start, or a suppressed second delivery."""
    with _guard("a cron start"):
        if first:
            setattr(request, CRON_STARTED_ATTR, time.monotonic())
        else:
            m.CRON_SUPPRESSED.labels(task_id).inc()


def cron_run_finished(request: Any, task_id: str, outcome: str) -> None:
    """The end of a cron run (``outcome``: a ``CronOutcome``); duration when its start is known."""
    with _guard("a cron end"):
        m.CRON_RUNS.labels(task_id, str(outcome)).inc()
        started = getattr(request, CRON_STARTED_ATTR, None) if request is not None else None
        if started is not None:
            m.CRON_RUN_DURATION.labels(task_id).observe(time.monotonic() - started)


# --- zero series at start -------------------------------------------------------------------
# A labelled series exists only once it was touched; alert rules (``increase(...) > 0``) and
# dashboards need it to exist before the first event, so each process starts its own at 0.
def initialise_beat(regions: Iterable[str], task_ids: Iterable[str]) -> None:
    with _guard("initial series"):
        for task_id in task_ids:
            m.CRON_FIRED.labels(task_id)
            m.CRON_MISSED.labels(task_id)
        for result in ("published", "lost"):
            m.CRON_TAKEOVERS.labels(result)
        _initialise_dispatch(regions)


def _initialise_dispatch(regions: Iterable[str]) -> None:
    for region in regions:
        m.DISPATCH_RATE_LIMITED.labels(region)
        for lane in LANE_NAMES:
            for counter in (
                m.DISPATCH_PROMOTED,
                m.DISPATCH_CLAIMED,
                m.DISPATCH_PUBLISHED,
                m.DISPATCH_RELEASED,
                m.DISPATCH_REAPED,
            ):
                counter.labels(region, lane)


def initialise_worker(
    region: str,
    lanes: Iterable[str],
    statuses: Iterable[str],
    abandon_reasons: Iterable[str] = (),
) -> None:
    """A check worker of ``region`` consuming ``lanes``; ``statuses``: every run status;
    ``abandon_reasons``: every reason a run is abandoned before its probe."""
    with _guard("initial series"):
        _initialise_dispatch([region])
        statuses, abandon_reasons = tuple(statuses), tuple(abandon_reasons)
        for lane in lanes:
            for status in statuses:
                m.RUNS.labels(region, lane, status)
            for reason in abandon_reasons:
                m.RUNS_ABANDONED.labels(region, lane, reason)
            for metric in (m.RUN_LATENESS, m.RUN_DURATION, m.RUN_TIMEOUTS, m.RUN_LEASE_GONE):
                metric.labels(region, lane)


def initialise_cron_runs(task_ids: Iterable[str], outcomes: Iterable[str]) -> None:
    """The cron-run series of the tasks this worker knows (declared in code)."""
    with _guard("initial series"):
        outcomes = tuple(outcomes)
        for task_id in task_ids:
            m.CRON_SUPPRESSED.labels(task_id)
            m.CRON_RUN_DURATION.labels(task_id)
            for outcome in outcomes:
                m.CRON_RUNS.labels(task_id, outcome)
