"""Every metric checkbeat exports, defined once (names, help, labels, buckets).

Why one module: beat and workers record some of the same series (a worker's refill claims and
publishes like beat's dispatcher), and the alert rules and the dashboard name them; one place
keeps the names from drifting. Conventions: ``checkbeat_`` prefix, base units (seconds),
counters end in ``_total``; labels take only bounded values (region, lane, status, reason, the
cron task id); per-check series come only from the capped exporter (:mod:`.checks_exporter`
in ``celery_app.checks``).

Scrape-time gauges (queue depths, free slots, Redis reachability) are not here: they are read
from Redis when scraped (``celery_app.checks.metrics_state``), so they are right on any beat.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

#: Seconds between a job's tick and its probe starting (fast lane should stay in the first few).
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
CRON_RUN_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

REGION_LANE = ("region", "lane")

# --- beat: the loop and the cron engine -----------------------------------------------------
BEAT_LAST_TICK = Gauge(
    "checkbeat_beat_last_tick_timestamp_seconds",
    "Unix time the beat loop last finished a tick (stale: the loop is stuck or dead).",
)
BEAT_TICK_DURATION = Histogram(
    "checkbeat_beat_tick_duration_seconds",
    "Wall time of one beat tick (cron windows, takeover, drivers).",
    buckets=TICK_BUCKETS,
)
BEAT_TICK_FAILURES = Counter(
    "checkbeat_beat_tick_failures_total",
    "Beat ticks that failed (Redis or the broker unreachable); retried with back-off.",
)
CRON_FIRED = Counter(
    "checkbeat_cron_windows_fired_total",
    "Cron windows this beat claimed and published (one per task, tenant and window).",
    ["task"],
)
CRON_SKIPPED = Counter(
    "checkbeat_cron_windows_skipped_total",
    "Cron windows this beat did not send, by reason (taken by another beat, in flight, ...).",
    ["task", "reason"],
)
CRON_MISSED = Counter(
    "checkbeat_cron_windows_missed_total",
    "Gaps found: runs of windows whose grace passed before any beat fired them.",
    ["task"],
)
CRON_TAKEOVERS = Counter(
    "checkbeat_cron_takeovers_total",
    "Claims another beat took and never confirmed, taken over by this one (published or lost).",
    ["result"],
)

# --- cron runs, recorded on any worker ----------------------------------------------------
CRON_RUNS = Counter(
    "checkbeat_cron_runs_total",
    "Finished cron runs by outcome (success, failure, expired, revoked).",
    ["task", "outcome"],
)
CRON_RUN_DURATION = Histogram(
    "checkbeat_cron_run_duration_seconds",
    "Wall time of a cron run, start to end, on the worker.",
    ["task"],
    buckets=CRON_RUN_BUCKETS,
)
CRON_SUPPRESSED = Counter(
    "checkbeat_cron_runs_suppressed_total",
    "Second deliveries of a window that already started (takeover, redelivery): not run.",
    ["task"],
)

# --- dispatch: beat's ticks and the workers' refills --------------------------------------
DISPATCH_PROMOTED = Counter(
    "checkbeat_dispatch_promoted_total",
    "Due jobs moved into the ready index of their region and lane.",
    REGION_LANE,
)
DISPATCH_CLAIMED = Counter(
    "checkbeat_dispatch_claimed_total", "Jobs claimed (leased) for a free slot.", REGION_LANE
)
DISPATCH_PUBLISHED = Counter(
    "checkbeat_dispatch_published_total", "Claimed jobs published to their lane queue.", REGION_LANE
)
DISPATCH_RELEASED = Counter(
    "checkbeat_dispatch_released_total",
    "Claims given back to the ready index because publishing failed.",
    REGION_LANE,
)
DISPATCH_REAPED = Counter(
    "checkbeat_dispatch_reaped_total",
    "Expired leases finished as lost runs (worker killed, message lost).",
    REGION_LANE,
)
DISPATCH_RATE_LIMITED = Counter(
    "checkbeat_dispatch_rate_limited_total",
    "Due jobs a tenant's token bucket turned away (moved to the held index).",
    ["region"],
)

# --- check runs, recorded on the lane workers ---------------------------------------------
RUNS = Counter(
    "checkbeat_check_runs_total",
    "Finished check runs by status (up, down, timeout, ...).",
    ["region", "lane", "status"],
)
RUN_LATENESS = Histogram(
    "checkbeat_check_start_lateness_seconds",
    "Seconds from a job's scheduled tick to its probe starting on a worker.",
    REGION_LANE,
    buckets=LATENESS_BUCKETS,
)
RUN_DURATION = Histogram(
    "checkbeat_check_probe_duration_seconds",
    "Wall time of a probe on the worker.",
    REGION_LANE,
    buckets=PROBE_BUCKETS,
)
RUN_TIMEOUTS = Counter(
    "checkbeat_check_timeouts_total",
    "Runs that hit their deadline or hard time limit.",
    REGION_LANE,
)
RUN_LEASE_GONE = Counter(
    "checkbeat_check_lease_gone_total",
    "Post-exec writes that found their lease gone (reaped, deleted or already recorded).",
    REGION_LANE,
)
RUNS_ABANDONED = Counter(
    "checkbeat_check_runs_abandoned_total",
    "Runs that raised before their probe: lease released and job placed at its next tick at "
    "once (the claimed tick lost, counted in the job), by reason (start-read, before-probe).",
    ["region", "lane", "reason"],
)

#: Series beat records (its own process).
BEAT_METRICS: tuple[MetricWrapperBase, ...] = (
    BEAT_LAST_TICK,
    BEAT_TICK_DURATION,
    BEAT_TICK_FAILURES,
    CRON_FIRED,
    CRON_SKIPPED,
    CRON_MISSED,
    CRON_TAKEOVERS,
)
#: Series beat and workers both record (the dispatcher runs in both).
SHARED_METRICS: tuple[MetricWrapperBase, ...] = (
    DISPATCH_PROMOTED,
    DISPATCH_CLAIMED,
    DISPATCH_PUBLISHED,
    DISPATCH_RELEASED,
    DISPATCH_REAPED,
    DISPATCH_RATE_LIMITED,
)
#: Series workers record (cron runs on any worker, check runs on lane workers).
WORKER_METRICS: tuple[MetricWrapperBase, ...] = (
    CRON_RUNS,
    CRON_RUN_DURATION,
    CRON_SUPPRESSED,
    RUNS,
    RUN_LATENESS,
    RUN_DURATION,
    RUN_TIMEOUTS,
    RUN_LEASE_GONE,
    RUNS_ABANDONED,
)
ALL_METRICS = BEAT_METRICS + SHARED_METRICS + WORKER_METRICS
