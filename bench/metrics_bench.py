"""Scrape cost of the per-check exporter with 100,000 checks stored.

Reproduce (from the repository root, ~1 minute):

    .venv/bin/python -m bench.metrics_bench            # 100,000 checks
    .venv/bin/python -m bench.metrics_bench --quick    # smoke: 2,000 checks

On a private redis-server: creates N checks (one region, batched), writes a last result for
each, then times an HTTP GET of ``/metrics/checks?page=P`` from a real beat metrics server
(the same page code beat serves) at the default cap (1,000 checks per page), for the first,
a middle and the last page (three scrapes each, with the sorted uid list kept by a refresher
thread as beat keeps it; the time of that read is printed too), and one page with the cap
raised ten times for comparison (the cost grows with the page, not with the checks stored).
The issue's bar: a capped page answers in under one second.
"""

from __future__ import annotations

import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.figures import command_line, quick_or_full
from celery_app.checks.definition import validate_definition
from celery_app.checks.kinds import check_kind
from celery_app.checks.metrics_exporter import CheckExporter
from celery_app.checks.run_contract import RunRecord, RunStatus
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import RedisServer
from celery_app.metrics.server import MetricsServer
from celery_app.redis.schema import Keys
from celery_app.settings import load_settings

BENCH_KIND = "bench-metrics"
REGION = "eu"
PAGE = 1000


def _probe(target: str, config: dict) -> dict:
    return {"ok": True}


def _get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as reply:
        body = reply.read()
    return time.perf_counter() - started, len(body)


def run(checks: int, out=sys.stdout) -> dict:
    import redis

    from beat.metrics_endpoint import checks_page

    check_kind(BENCH_KIND)(_probe)
    server = RedisServer(Path(tempfile.mkdtemp(prefix="checkbeat-bench-"))).start()
    try:
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), key_prefix="cb", regions=[REGION]
        )
        client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        keys = Keys(settings.key_prefix)
        defs = [
            validate_definition(
                settings,
                uid=f"chk-{i:06d}",
                tenant=f"tenant-{i % 500:03d}",
                kind=BENCH_KIND,
                target=f"https://example-{i % 1000}.test/health",
                period=60,
                regions=[REGION],
            )
            for i in range(checks)
        ]
        started = time.perf_counter()
        CheckStore(client, keys, settings).create_many(defs)
        pipe = client.pipeline(transaction=False)
        for i in range(checks):
            status = RunStatus.UP if i % 10 else RunStatus.DOWN
            result = RunRecord(status=status, region=REGION, finished_at=1.79e9, latency_ms=40.0)
            pipe.hset(keys.last_result(f"chk-{i:06d}"), REGION, result.to_json())
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        setup_s = time.perf_counter() - started

        capped = CheckExporter(client, keys, PAGE)
        raised = CheckExporter(client, keys, PAGE * 10)
        reads = []
        for _ in range(3):
            t0 = time.perf_counter()
            capped.reload()
            reads.append(time.perf_counter() - t0)
        raised.reload()
        capped.start_refresh()  # as beat runs it: scrapes use the list it keeps
        raised.start_refresh()
        http = MetricsServer(
            "127.0.0.1:0",
            {"/capped": checks_page(capped), "/raised": checks_page(raised)},
            name="bench",
            role="bench",
        ).start()
        pages = capped.pages(checks)
        rows = []
        for page in sorted({0, pages // 2, pages - 1}):
            times = [_get(f"{http.url}/capped?page={page}") for _ in range(3)]
            first, size = times[0]
            rows.append(
                (f"capped page {page} ({PAGE:,} checks)", first, min(t for t, _ in times), size)
            )
        raised_s, raised_bytes = _get(f"{http.url}/raised?page=0")
        http.stop()
        capped.stop_refresh()
        raised.stop_refresh()
        p = lambda s: print(s, file=out)  # noqa: E731
        p(f"per-check exporter, {checks:,} checks stored (setup {setup_s:.1f} s)")
        p(f"  {'scrape (seconds)':<36} {'first':>7} {'best/3':>7} {'bytes':>11} {'vs cap x10':>11}")
        for name, first, best, size in rows:
            p(f"  {name:<36} {first:>7.3f} {best:>7.3f} {size:>11,} {first / raised_s:>10.3f}x")
        label = f"cap raised x10: page 0 ({PAGE * 10:,})"
        p(f"  {label:<36} {raised_s:>7.3f} {'':>7} {raised_bytes:>11,} {1:>10.3f}x")
        p(
            f"  uid list read + sort, in beat's refresher thread every 30 s (no scrape waits): "
            f"{min(reads):.3f} s (best of 3)"
        )
        worst = max(first for _n, first, _b, _s in rows)
        p(f"  worst capped page: {worst:.3f} s ({'under' if worst < 1 else 'OVER'} the 1 s bar)")
        return {
            "capped pages": [
                {"page": name, "first_s": first, "best_s": best, "bytes": size}
                for name, first, best, size in rows
            ],
            "raised_bytes": raised_bytes,
            "worst_capped_s": worst,
            "raised_s": raised_s,
            "uid_read_s": min(reads),
            "pages": pages,
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict:
    return run(quick_or_full(argv, __doc__.splitlines()[0], 2_000, 100_000, "checks"))


if __name__ == "__main__":
    command_line(main)
