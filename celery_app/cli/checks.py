"""``celery -A celery_app checks ...``: manage checks, their rate limits, and report on them.

``diagnose`` exits 1 when it reports a problem; every command exits 2 with one line when it
cannot run (Redis unreachable, bad settings: ``cli.common``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, cast

import click

from celery_app.checks.capacity import diagnose_regions, read_capacity
from celery_app.checks.check_state import read_transitions
from celery_app.checks.definition import CheckDefinition
from celery_app.checks.jobs import UnreadableJob, read_jobs_for_report
from celery_app.checks.notify import NotifyStore
from celery_app.checks.quarantine import read_quarantine
from celery_app.checks.ratelimit import (
    clear_rate_limit,
    default_burst,
    get_rate_limit,
    set_rate_limit,
)
from celery_app.checks.redaction import (
    check_secrets,
    redact_definition,
    redact_target,
    scrub_value,
)
from celery_app.checks.reports import read_all_jobs, summarize
from celery_app.checks.store import CheckStore
from celery_app.cli.checks_state import (
    echo_state,
    maintenance,
    maintenance_summary,
    read_check_health,
    transitions,
)
from celery_app.cli.common import (
    EXIT_PROBLEM,
    MAX_LISTED,
    BadInput,
    CheckbeatGroup,
    check_store,
    echo_rows,
    findings_json_option,
)
from celery_app.cli.terminal import escape
from celery_app.errors import CheckExists, CheckFieldError, CheckNotFound
from celery_app.factory import settings_of
from celery_app.findings import findings_json
from celery_app.input_limits import InputLimitError, loads_json
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import LANE_NAMES, ResultField, split_job_id


def _iso(seconds: float | None) -> str | None:
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _fail(exc: Exception) -> click.ClickException:
    """Bad input (a field refused) exits 2, a refused request (uid taken or unknown) 1."""
    if isinstance(exc, CheckFieldError):
        return BadInput(str(exc))
    return click.ClickException(str(exc))


def _regions(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [r.strip() for r in value.split(",") if r.strip()]


def _config(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return loads_json(value, "config")
    except json.JSONDecodeError as exc:
        raise BadInput(f"config: is not valid JSON: {exc}") from None
    except InputLimitError as exc:
        raise BadInput(str(exc)) from None


@click.group(name="checks", cls=CheckbeatGroup)
def checks() -> None:
    """Manage recurring checks (definitions, rate limits) and report on their scheduling."""


def _definition_options(required: bool):
    def decorate(fn):
        for option in reversed(
            [
                click.option("--tenant", required=required, help="Tenant owning the check."),
                click.option("--kind", required=required, help="Registered check kind."),
                click.option("--target", required=required, help="What to probe."),
                click.option("--period", type=int, required=required, help="Seconds (>= 1)."),
                click.option("--regions", help="Comma list; default: the first region."),
                click.option("--region-spread", type=float, help="Seconds between regions."),
                click.option("--plan-weight", type=int, help="Plan tier weight (>= 0)."),
                click.option("--config", help="Kind configuration as a JSON object."),
                click.option(
                    "--failure-threshold", type=int, help="Failures in a row to go down (1-100)."
                ),
                click.option(
                    "--success-threshold", type=int, help="Successes in a row to recover (1-100)."
                ),
                click.option("--quorum", type=int, help="Regions down for the check to be down."),
            ]
        ):
            fn = option(fn)
        return fn

    return decorate


@checks.command("add")
@click.argument("uid")
@_definition_options(required=True)
@click.pass_context
def add(ctx: click.Context, uid: str, **opts: Any) -> None:
    """Create check UID and place its region jobs on their phase."""
    fields = {
        "uid": uid,
        "tenant": opts["tenant"],
        "kind": opts["kind"],
        "target": opts["target"],
        "period": opts["period"],
        "regions": _regions(opts["regions"]),
        "region_spread": opts["region_spread"],
        "plan_weight": opts["plan_weight"] or 0,
        "config": _config(opts["config"]) or {},
        "failure_threshold": opts["failure_threshold"],
        "success_threshold": opts["success_threshold"],
        "quorum": opts["quorum"],
    }
    try:
        defn = check_store(ctx).create(**fields)
    except (CheckFieldError, CheckExists) as exc:
        raise _fail(exc) from None
    click.echo(
        f"added {defn.uid} ({defn.kind} {escape(redact_target(defn.target))}) "
        f"every {defn.period}s in {','.join(defn.regions)}"
    )


@checks.command("update")
@click.argument("uid")
@_definition_options(required=False)
@click.option("--no-region-spread", is_flag=True, help="Back to the default spread.")
@click.option(
    "--default-state-rules",
    is_flag=True,
    help="Thresholds and quorum back to the defaults (settings, a majority).",
)
@click.pass_context
def update(
    ctx: click.Context, uid: str, no_region_spread: bool, default_state_rules: bool, **opts: Any
) -> None:
    """Change some fields of check UID; its jobs are reconciled (EWMAs kept)."""
    changes: dict[str, Any] = {}
    names = ("tenant", "kind", "target", "period", "region_spread", "plan_weight")
    for name in (*names, "failure_threshold", "success_threshold", "quorum"):
        if opts[name] is not None:
            changes[name] = opts[name]
    if opts["regions"] is not None:
        changes["regions"] = _regions(opts["regions"])
    if opts["config"] is not None:
        changes["config"] = _config(opts["config"])
    if no_region_spread:
        changes["region_spread"] = None
    if default_state_rules:
        changes.update(failure_threshold=None, success_threshold=None, quorum=None)
    if not changes:
        raise click.UsageError("nothing to change: pass at least one option")
    try:
        defn = check_store(ctx).update(uid, **changes)
    except (CheckFieldError, CheckNotFound) as exc:
        raise _fail(exc) from None
    click.echo(f"updated {defn.uid}")


@checks.command("rm")
@click.argument("uid")
@click.pass_context
def rm(ctx: click.Context, uid: str) -> None:
    """Delete check UID, its jobs, leases and results."""
    if not check_store(ctx).delete(uid):
        raise click.ClickException(f"no check with uid {uid!r}")
    click.echo(f"deleted {escape(uid)}")


@checks.command("enable")
@click.argument("uid")
@click.pass_context
def enable(ctx: click.Context, uid: str) -> None:
    """Enable check UID (its jobs are placed at their next tick)."""
    try:
        check_store(ctx).set_enabled(uid, True)
    except CheckNotFound as exc:
        raise _fail(exc) from None
    click.echo(f"enabled {escape(uid)}")


@checks.command("disable")
@click.argument("uid")
@click.pass_context
def disable(ctx: click.Context, uid: str) -> None:
    """Disable check UID (its jobs leave every index; EWMAs are kept)."""
    try:
        check_store(ctx).set_enabled(uid, False)
    except CheckNotFound as exc:
        raise _fail(exc) from None
    click.echo(f"disabled {escape(uid)}")


@checks.command("list")
@click.option("--tenant", help="Only this tenant's checks.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_checks(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """List checks (of one tenant)."""
    echo_rows(
        check_store(ctx).list(tenant=tenant),
        as_json,
        none="no checks",
        header=f"{'UID':24} {'TENANT':16} {'KIND':10} {'PERIOD':>7} {'REGIONS':16} STATE  TARGET",
        line=_check_line,
        as_dict=lambda d: redact_definition(d.as_dict()),
    )


def _check_line(d: CheckDefinition) -> str:
    state = "on " if d.enabled else "off"
    return (
        f"{escape(d.uid):24} {escape(d.tenant):16} {escape(d.kind):10} {d.period:>6}s "
        f"{escape(','.join(d.regions)):16} {state}    {escape(redact_target(d.target))}"
    )


def _show_data(store: CheckStore, uid: str, history: int) -> dict[str, Any]:
    stored = store.require(uid)
    keys = store.keys
    jobs: list[dict[str, Any]] = []
    for job in read_jobs_for_report(store.redis, keys, stored.definition.job_ids()):
        if job is None:
            continue
        if isinstance(job, UnreadableJob):
            region = split_job_id(job.job_id)[1]
            jobs.append({"job": job.job_id, "region": region, "unreadable": job.reason})
            continue
        last = store.redis.hget(keys.last_result(uid), job.region)
        jobs.append(
            {
                "job": job.job_id,
                "region": job.region,
                "scheduled_at": _iso(job.scheduled_at),
                "effective_scheduled_at": _iso(job.effective_scheduled_at),
                "cost_ewma_ms": round(job.cost_ewma_ms, 3),
                "delay_ewma_ms": round(job.delay_ewma_ms, 3),
                "lane": LANE_NAMES[job.lane],
                "runs": job.runs,
                "skipped_by_rate_limit": job.skipped,
                "abandoned_before_probe": job.abandoned,
                "passed_over_late": job.passed,
                "leased_until": _iso(job.lease_expiry),
                "enabled": job.enabled,
                "last_result": json.loads(last) if last else None,
            }
        )
    recent = [
        {
            "id": entry_id,
            "region": f.get(ResultField.REGION),
            "result": json.loads(f.get(ResultField.RECORD, "null")),
        }
        for entry_id, f in cast(
            "list[tuple[str, dict[str, str]]]",  # decode_responses=True
            store.redis.xrevrange(keys.results(uid), count=history),
        )
    ]
    # Records are scrubbed when a run is built (RunOutcome.of_probe); scrubbing what is shown
    # as well keeps a secret out of the output whatever wrote the record.
    secrets = check_secrets(stored.definition.target, stored.definition.config)
    return scrub_value(
        {
            "check": redact_definition(stored.definition.as_dict()),
            "version": stored.version,
            "state": read_check_health(store, uid).as_dict(),
            "maintenance": maintenance_summary(store, stored.definition),
            "notify": [
                t.as_dict()
                for t in NotifyStore(store.redis, keys).for_check(uid, stored.definition.tenant)
            ],
            "transitions": read_transitions(
                store.redis, keys.check_transitions(uid), count=history
            ),
            "jobs": jobs,
            "results": recent,
        },
        secrets,
    )


@checks.command("show")
@click.argument("uid")
@click.option(
    "--results",
    "history",
    type=click.IntRange(0, MAX_LISTED),
    default=10,
    show_default=True,
    help="Recent results.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def show(ctx: click.Context, uid: str, history: int, as_json: bool) -> None:
    """Definition, each region job's times, EWMAs and lane, and the last results."""
    try:
        data = _show_data(check_store(ctx), uid, history)
    except CheckNotFound as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for name, value in data["check"].items():
        click.echo(f"{name:14} {escape(value)}")
    echo_state(data)
    for job in data["jobs"]:
        if "unreadable" in job:
            click.echo(f"\n[{escape(job['region'])}] unreadable job: {escape(job['unreadable'])}")
            click.echo("  (`checks diagnose` lists it; `checks reconcile` rebuilds it)")
            continue
        click.echo(
            f"\n[{escape(job['region'])}] lane={job['lane']} runs={job['runs']} "
            f"skipped={job['skipped_by_rate_limit']} abandoned={job['abandoned_before_probe']} "
            f"passed={job['passed_over_late']}"
        )
        click.echo(f"  scheduled_at           {job['scheduled_at']}")
        click.echo(f"  effective_scheduled_at {job['effective_scheduled_at']}")
        click.echo(f"  cost_ewma_ms {job['cost_ewma_ms']}  delay_ewma_ms {job['delay_ewma_ms']}")
        if job["leased_until"]:
            click.echo(f"  running, lease until {job['leased_until']}")
        click.echo(f"  last result  {json.dumps(job['last_result'])}")
    if data["results"]:
        click.echo("\nrecent results:")
        for entry in data["results"]:
            region = escape(entry["region"])
            click.echo(f"  {entry['id']} {region} {json.dumps(entry['result'])}")


@checks.command("costs")
@click.option("--tenant", help="Only this tenant's jobs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def costs(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """Cost EWMA distribution per lane, and delay EWMA percentiles."""
    store = check_store(ctx)
    jobs = read_all_jobs(store.redis, store.keys, tenant)
    unreadable = [j for j in jobs if isinstance(j, UnreadableJob)]
    for job in unreadable:  # stderr: --json stays the same list of lanes
        click.echo(f"left out, unreadable: {escape(job.job_id)} ({escape(job.reason)})", err=True)
    reports = summarize([j for j in jobs if not isinstance(j, UnreadableJob)])
    if as_json:
        click.echo(json.dumps([asdict(r) for r in reports], indent=2))
        return
    for rep in reports:
        c, d = rep.cost, rep.delay
        click.echo(f"lane {rep.lane}: {c.count} job(s)")
        click.echo(
            f"  cost ms   p50 {c.p50:.1f}  p90 {c.p90:.1f}  p99 {c.p99:.1f}  max {c.max:.1f}"
        )
        click.echo(
            f"  delay ms  p50 {d.p50:.1f}  p90 {d.p90:.1f}  p99 {d.p99:.1f}  max {d.max:.1f}"
        )
        for label, count in rep.buckets.items():
            click.echo(f"    cost {label:>12}: {count}")


@checks.command("ratelimit")
@click.argument("tenant")
@click.option(
    "--per-minute",
    type=float,
    help="Runs per minute the tenant may start: > 0 (fractions such as 0.5 allowed).",
)
@click.option(
    "--burst",
    type=float,
    help="Bucket size, >= 1 (default: the per-minute rate, at least 1).",
)
@click.option("--off", is_flag=True, help="Remove the tenant's bucket.")
@click.pass_context
def ratelimit(
    ctx: click.Context, tenant: str, per_minute: float | None, burst: float | None, off: bool
) -> None:
    """Show, set (--per-minute N --burst B) or remove (--off) a tenant's token bucket."""
    settings = settings_of(ctx.obj.app)
    from celery_app.redis.client import get_redis

    client, keys = get_redis(settings.redis_url, settings), state_keys(settings)
    if off:
        removed = clear_rate_limit(client, keys, tenant)
        name = escape(tenant)
        click.echo(f"rate limit of {name} removed" if removed else f"{name} had no rate limit")
        return
    if per_minute is None:
        if burst is not None:
            raise click.UsageError("--burst needs --per-minute")
        current = get_rate_limit(client, keys, tenant)
        click.echo(
            f"{escape(tenant)}: no rate limit"
            if current is None
            else f"{escape(tenant)}: {current.per_minute:g}/min, burst {current.burst:g}"
        )
        return
    try:
        bucket = set_rate_limit(
            client,
            keys,
            tenant,
            per_minute=per_minute,
            burst=default_burst(per_minute) if burst is None else burst,
        )
    except CheckFieldError as exc:
        raise _fail(exc) from None
    click.echo(f"{tenant}: {bucket.per_minute:g}/min, burst {bucket.burst:g}")


@checks.command("reconcile")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def reconcile(ctx: click.Context, as_json: bool) -> None:
    """Rebuild jobs from the check definitions (after a Redis restore without AOF); first move
    the checks to the partition count set, if it changed (beats and workers stopped)."""
    from celery_app.checks.repair import repair
    from celery_app.checks.repartition import WorkersStillRunning, repartition
    from celery_app.redis.client import get_redis
    from scheduling_core import Params

    settings = settings_of(ctx.obj.app)
    client, keys = get_redis(settings.redis_url, settings), state_keys(settings)
    try:
        moved = repartition(client, keys, list(settings.regions))
    except WorkersStillRunning as exc:
        raise click.ClickException(str(exc)) from None
    report = repair(client, keys, Params.from_settings(settings), datetime.now(UTC))
    if as_json:
        click.echo(json.dumps(asdict(report) | {"repartitioned": moved and asdict(moved)}))
        return
    if moved is not None:
        click.echo(
            f"moved {moved.checks} check(s) from {moved.before} to {moved.after} partition(s)"
        )
    click.echo(
        f"{report.checks} check(s): {len(report.placed)} job(s) placed again, "
        f"{len(report.leases_restored)} lease(s) restored to the reaper, "
        f"{len(report.conflicts)} changed meanwhile (run again), "
        f"{len(report.released)} quarantined job(s) rebuilt"
    )
    for uid in report.undecodable:
        click.echo(f"PROBLEM: check {escape(uid)}: its definition cannot be read; left as it is")


@checks.command("diagnose")
@findings_json_option
@click.pass_context
def diagnose(ctx: click.Context, as_json: bool) -> None:
    """Capacity per region and what keeps due checks from being claimed. Exit 1 if any."""
    settings = settings_of(ctx.obj.app)
    from celery_app.redis.client import get_redis

    client, keys = get_redis(settings.redis_url, settings), state_keys(settings)
    problems = diagnose_regions(client, keys, list(settings.regions))
    problems += [q.finding() for q in read_quarantine(client, keys)]
    if as_json:
        # The same list as `schedule diagnose --json`: what is wrong, not the capacity (the
        # text form's lines; the region gauges in docs/metrics.md serve it to a program).
        click.echo(findings_json(problems))
        ctx.exit(EXIT_PROBLEM if problems else 0)
    for cap in (read_capacity(client, keys, region) for region in settings.regions):
        click.echo(
            f"{cap.region}: {len(cap.workers)} worker(s), {cap.total} slot(s) "
            f"({cap.slow_capacity} shared), in flight {cap.in_flight_fast} fast / "
            f"{cap.in_flight_slow} slow, free {cap.free} ({cap.free_slow} for slow)"
        )
    for problem in problems:
        click.echo(f"PROBLEM: {escape(problem.message)}")
    if not problems:
        click.echo("no problems")
    else:
        ctx.exit(EXIT_PROBLEM)


checks.add_command(maintenance)
checks.add_command(transitions)


def _add_report() -> None:
    from celery_app.cli.checks_report import report

    checks.add_command(report)


_add_report()


def _add_notify() -> None:
    from celery_app.cli.checks_notify import notify

    checks.add_command(notify)


_add_notify()


def _add_checks_as_code() -> None:
    from celery_app.cli.checks_code import apply, export
    from celery_app.cli.heartbeats import ping_command, ping_url, serve_pings

    checks.add_command(apply)
    checks.add_command(export)
    checks.add_command(ping_command)
    checks.add_command(ping_url)
    checks.add_command(serve_pings)


_add_checks_as_code()
