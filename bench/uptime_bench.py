"""A month's uptime report for 10,000 checks: the time per check and in total, and its Redis
round trips.

Reproduce (from the repository root):

    .venv/bin/python -m bench.uptime_bench            # 10,000 checks
    .venv/bin/python -m bench.uptime_bench --quick    # smoke: 500 checks

On a private redis-server: creates N three-region checks in 100 tenants, then writes a month
(and a week before it) of history as complete.lua and transition_release.lua write it: each
check's first counted result (``CheckStateField.FIRST``) and transition count, its transitions
in its capped stream in the production JSON (an incident every ten days on average, degraded
or down for minutes to hours; one check in fifty a flapping one whose stream holds its cap,
``CHECKBEAT_TRANSITIONS_HISTORY``, so its history starts inside the month), its results
stream, and maintenance windows (a weekly window on every tenant, a daily one on one check in
ten). Then times, on a client that counts its round
trips: the month's report of every check by day (``uptime_reports`` over every uid, as
``checks report --tenant`` reads them, in one pass over all tenants), and single-check reports
of a sample (as ``checks report UID``), each its own read.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.figures import command_line, quick_or_full
from celery_app.checks.definition import validate_definition
from celery_app.checks.kinds import check_kind
from celery_app.checks.maintenance import MaintenanceStore, validate_window
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.checks.store import CheckStore
from celery_app.checks.uptime import uptime_reports
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import CheckStateField, ResultField, TransitionField
from celery_app.settings import load_settings
from scheduling_core.uptime import Bucket
from tests.support.round_trips import counting_client

KIND = "uptimebench"
REGIONS = ["ap", "eu", "us"]
TENANTS = 100
MONTH_START = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
MONTH_END = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
SAMPLE = 200  # single-check reports timed


def _probe(target: str, config: dict) -> dict:
    return {"ok": True}


def _history(rng: random.Random, uid: str, tenant: str, cap: int) -> list[str]:
    """The transition JSONs of one check over the week before the month and the month: a few
    incidents (a region down for minutes to hours, the quorum of two following), sometimes
    degraded spells; one check in fifty flaps every few minutes."""
    flapping = rng.random() < 0.02
    t = MONTH_START - 7 * 86400 + rng.uniform(0, 86400)
    state, seq, out = "up", 0, []
    while True:
        if flapping:
            t += rng.uniform(120, 900)
        else:
            t += rng.expovariate(1 / (10 * 86400)) if state == "up" else rng.uniform(300, 4 * 3600)
        if t >= MONTH_END:
            return out[-cap:]
        to = ("degraded" if rng.random() < 0.3 else "down") if state == "up" else "up"
        seq += 1
        regions = {r: {TransitionField.STATE: to if r != "ap" else "up", "result": None}
                   for r in REGIONS}  # fmt: skip
        out.append(
            json.dumps(
                {
                    TransitionField.ID: f"{uid}#{seq}",
                    TransitionField.UID: uid,
                    TransitionField.TENANT: tenant,
                    TransitionField.FROM: state,
                    TransitionField.TO: to,
                    TransitionField.AT: round(t, 3),
                    TransitionField.HELD: False,
                    TransitionField.REGIONS: regions,
                },
                separators=(",", ":"),
            )
        )
        state = to


def run(checks: int, out=sys.stdout) -> dict:
    check_kind(KIND)(_probe)
    rng = random.Random(7)
    server = RedisServer(Path(tempfile.mkdtemp(prefix="checkbeat-uptime-bench-"))).start()
    try:
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), key_prefix="ub", regions=REGIONS
        )
        state = get_redis(settings.redis_url, settings)
        keys = state_keys(settings)
        uids = [f"c{i:05d}" for i in range(checks)]
        tenant_of = {uid: f"t{i % TENANTS:03d}" for i, uid in enumerate(uids)}
        started = time.perf_counter()
        CheckStore(state, keys, settings).create_many(
            [
                validate_definition(
                    settings, uid=uid, tenant=tenant_of[uid], kind=KIND, target="x", period=60,
                    regions=REGIONS,
                )
                for uid in uids
            ]
        )  # fmt: skip
        cap = settings.transitions_history
        transitions = 0
        pipe = state.pipeline(transaction=False)
        for n, uid in enumerate(uids):
            history = _history(rng, uid, tenant_of[uid], cap)
            transitions += len(history)
            first = MONTH_START - 7 * 86400 - rng.uniform(0, 90 * 86400)
            seq = (
                int(json.loads(history[-1])[TransitionField.ID].rpartition("#")[2])
                if history
                else 0
            )
            pipe.hset(
                keys.check_state(uid),
                mapping={CheckStateField.FIRST: f"{first:.3f}", CheckStateField.SEQ: seq},
            )
            for text in history:
                tid = json.loads(text)[TransitionField.ID]
                pipe.xadd(
                    keys.check_transitions(uid),
                    {TransitionField.ID: tid, TransitionField.RECORD: text},
                )
            record = RunRecord(status=RunStatus.UP, region="eu", finished_at=MONTH_END - 60)
            pipe.xadd(
                keys.results(uid), {ResultField.REGION: "eu", ResultField.RECORD: record.to_json()}
            )
            if n % 500 == 499:
                pipe.execute()
        pipe.execute()
        windows = MaintenanceStore(state, keys)
        for t in range(TENANTS):
            windows.add(validate_window(tenant=f"t{t:03d}", cron="0 3 * * sun", duration=3600,
                                        timezone="Europe/Berlin"))  # fmt: skip
        for uid in uids[::10]:
            windows.add(validate_window(uid=uid, cron="30 2 * * *", duration=600, timezone="UTC"))
        setup_s = time.perf_counter() - started

        client, sends = counting_client(settings.redis_url, type(state))
        client.ping()  # the connection's handshake is not the report's
        sends.clear()
        t0 = time.perf_counter()
        reports = uptime_reports(
            client, keys, uids, MONTH_START, MONTH_END, by=Bucket.DAY, now=MONTH_END + 3600
        )
        total_s = time.perf_counter() - t0
        total_trips = len(sends)
        assert len(reports) == checks

        sample = rng.sample(uids, min(SAMPLE, checks))
        single: list[float] = []
        sends.clear()
        for uid in sample:
            t1 = time.perf_counter()
            uptime_reports(
                client, keys, [uid], MONTH_START, MONTH_END, by=Bucket.DAY, now=MONTH_END + 3600
            )
            single.append(time.perf_counter() - t1)
        single_trips = len(sends) / len(sample)
        single.sort()

        incidents = sum(r.total.totals.incidents for r in reports)
        trimmed = sum(1 for r in reports if any("history starts" in n for n in r.notes))
        uptime = statistics.mean(
            r.total.totals.uptime_pct or 0.0 for r in reports if r.total.totals.uptime_pct
        )
        p = lambda s: print(s, file=out)  # noqa: E731
        p(
            f"uptime report, November 2026 by day, {checks:,} checks x 3 regions "
            f"({transitions:,} transitions stored, setup {setup_s:.1f} s)"
        )
        p(
            f"  all checks in one pass: {total_s:.3f} s, {1000 * total_s / checks:.3f} ms per "
            f"check, {total_trips} round trips"
        )
        p(
            f"  one check alone ({len(sample)} sampled): "
            f"p50 {1000 * single[len(single) // 2]:.2f} ms, "
            f"p99 {1000 * single[int(len(single) * 0.99) - 1]:.2f} ms, "
            f"{single_trips:.1f} round trips each"
        )
        p(
            f"  figures: {incidents:,} incidents, {trimmed} checks whose history starts inside "
            f"the month (stream capped at {cap}), mean uptime {uptime:.3f}%"
        )
        return {
            "checks": checks,
            "transitions": transitions,
            "total_s": total_s,
            "per_check_ms": 1000 * total_s / checks,
            "total_round_trips": total_trips,
            "single_p50_ms": 1000 * single[len(single) // 2],
            "single_p99_ms": 1000 * single[int(len(single) * 0.99) - 1],
            "single_round_trips": single_trips,
            "incidents": incidents,
            "trimmed": trimmed,
            "buckets": len(reports[0].buckets),
            "mean_uptime_pct": uptime,
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict:
    return run(quick_or_full(argv, __doc__.splitlines()[0], 500, 10_000, "checks"))


if __name__ == "__main__":
    command_line(main)
