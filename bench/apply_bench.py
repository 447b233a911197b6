"""Checks-as-code benchmark: ``checks apply`` of a 100,000-check file, against the 60 s budget
and against creating the same checks one ``CheckStore.create`` at a time.

Reproduce (from the repository root, ~1-2 minutes, needs nothing but the venv):

    .venv/bin/python -m bench.apply_bench            # 100,000 http checks x 2 regions
    .venv/bin/python -m bench.apply_bench --quick    # smoke: 500 checks
    .venv/bin/python -m bench.apply_bench --checks 20000 --windows   # + a window per check, tenant

What it does, on a private redis-server:

1. writes a checks file of N ``http`` checks (100 tenants, 2 regions, a judgement config) and 100
   tenant rate limits;
2. times ``checks apply`` on an empty store, phase by phase: read and validate the file (YAML
   load, every definition validated by its kind), the diff against the store, the batched
   writes; this is what ``celery -A <app> checks apply -f`` runs;
3. times the same file again (nothing to write), a file with 1% of the checks changed, the
   same checks as a JSON document into an empty store (JSON is YAML; it is read by ``json``),
   and ``checks export`` of the result;
4. creates a sample of checks one ``CheckStore.create`` at a time and prints the batched write
   rate beside it, as a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import redis
import yaml

from bench.figures import command_line
from celery_app.checks.manifest import load_manifest
from celery_app.checks.manifest_sync import (
    apply_plan,
    dump_manifest,
    export_manifest,
    plan_manifest,
)
from celery_app.checks.store import CheckStore
from celery_app.local.embedded_redis import RedisServer
from celery_app.redis.schema import Keys
from celery_app.settings import load_settings

REGIONS = ["eu", "us"]
TENANTS = 100
BUDGET_S = 60.0


WINDOW = "[{cron: '0 3 * * SUN', duration: 2h, timezone: Europe/Paris}]"


def checks_file(n: int, changed_every: int = 0, windows: bool = False) -> str:
    """The YAML of ``n`` checks; with ``changed_every`` k, every k-th check has another period;
    with ``windows``, every check and every tenant has a maintenance window."""
    lines = ["version: 1", "tenants:"]
    extra = f", maintenance: {WINDOW}" if windows else ""
    for t in range(TENANTS):
        lines.append(f"  tenant-{t:03d}: {{rate_limit: {{per_minute: 600, burst: 100}}{extra}}}")
    lines.append("checks:")
    for i in range(n):
        period = 30 if changed_every and i % changed_every == 0 else 60
        lines += [
            f"  - uid: chk-{i:06d}",
            f"    tenant: tenant-{i % TENANTS:03d}",
            "    kind: http",
            f"    target: https://svc-{i % 1000}.example.com/health/{i}",
            f"    period: {period}",
            "    regions: [eu, us]",
            "    config: {max_latency_ms: 800, tls_min_days: 14}",
        ]
        if windows:
            lines.append(f"    maintenance: {WINDOW}")
    return "\n".join(lines) + "\n"


def run(n: int, sample: int, out=sys.stdout, windows: bool = False) -> dict:
    import workers.probes  # noqa: F401 - registers the http kind

    def p(*a: object) -> None:
        print(*a, file=out)

    data_dir = Path(tempfile.mkdtemp(prefix="checkbeat-apply-bench-"))
    server = RedisServer(data_dir).start()
    try:
        settings = load_settings(
            redis_url=server.url(1), broker_url=server.url(0), key_prefix="cb", regions=REGIONS
        )
        client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        store = CheckStore(client, Keys(settings.key_prefix), settings)
        text = checks_file(n, windows=windows)
        shown = f", {n + TENANTS:,} maintenance windows" if windows else ""
        p(f"checks file: {n:,} checks x {len(REGIONS)} regions{shown}, {len(text) / 1e6:.1f} MB")

        def apply(body: str) -> dict:
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            manifest = load_manifest(body, settings, source="bench.yaml")
            t1 = time.perf_counter()
            plan = plan_manifest(store, manifest)
            t2 = time.perf_counter()
            apply_plan(store, plan)
            t3 = time.perf_counter()
            return {
                "validate_s": t1 - t0,
                "diff_s": t2 - t1,
                "write_s": t3 - t2,
                "total_s": t3 - t0,
                "cpu_s": time.process_time() - cpu0,
                "created": len(plan.creates),
                "updated": len(plan.updates),
                "windows": len(plan.window_adds) + len(plan.window_removes),
            }

        p(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores)")
        first = apply(text)
        jobs = client.zcard(store.keys.due())
        p(
            f"apply, empty store : {first['total_s']:6.1f} s total, {first['cpu_s']:.1f} s CPU "
            f"of this process  "
            f"(read+validate {first['validate_s']:.1f} s, diff {first['diff_s']:.1f} s, "
            f"write {first['write_s']:.1f} s); {first['created']:,} created, {jobs:,} jobs due, "
            f"{first['windows']:,} windows added"
        )
        p(
            f"  vs the {BUDGET_S:.0f} s budget: {first['total_s'] / BUDGET_S:.2f} of it "
            f"({n / first['total_s']:,.0f} checks/s)"
        )
        again = apply(text)
        p(
            f"apply, same file   : {again['total_s']:6.1f} s total, "
            f"{again['created'] + again['updated'] + again['windows']} written"
        )
        changed = apply(checks_file(n, changed_every=100, windows=windows))
        p(f"apply, 1% changed  : {changed['total_s']:6.1f} s total, {changed['updated']:,} updated")
        as_json = json.dumps(yaml.safe_load(checks_file(n, changed_every=100, windows=windows)))
        client.flushdb(asynchronous=True)
        json_run = apply(as_json)
        p(
            f"apply, JSON file   : {json_run['total_s']:6.1f} s total (read+validate "
            f"{json_run['validate_s']:.1f} s, write {json_run['write_s']:.1f} s), "
            f"{json_run['created']:,} created: x{first['total_s'] / json_run['total_s']:.1f} "
            "faster than the YAML file"
        )
        t0 = time.perf_counter()
        exported = dump_manifest(export_manifest(store))
        export_s = time.perf_counter() - t0
        p(f"export             : {export_s:6.1f} s ({len(exported) / 1e6:.1f} MB)")

        # one create at a time, for the ratio
        from celery_app.checks.definition import validate_definition

        manifest_sample = yaml.safe_load(checks_file(sample))["checks"]
        client.flushdb(asynchronous=True)
        defs = [validate_definition(settings, **c) for c in manifest_sample]
        t0 = time.perf_counter()
        for d in defs:
            store.create(**d.as_dict())
        single_s = time.perf_counter() - t0
        single_rate = sample / single_s
        batched_rate = first["created"] / first["write_s"]
        p(
            f"write rate         : batched {batched_rate:,.0f} checks/s vs one create at a time "
            f"{single_rate:,.0f} checks/s ({sample:,} sampled): x{batched_rate / single_rate:.1f}"
        )
        return {
            "checks": n,
            "sample": sample,
            "budget_s": BUDGET_S,
            "first": first,
            "again": again,
            "changed": changed,
            "json": json_run,
            "export_s": export_s,
            "batched_rate": batched_rate,
            "single_rate": single_rate,
            "batched_vs_single": batched_rate / single_rate,
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=100_000)
    parser.add_argument("--sample", type=int, default=2000, help="one-at-a-time creates")
    parser.add_argument("--quick", action="store_true", help="smoke run: 500 checks")
    parser.add_argument("--windows", action="store_true", help="a window per check and tenant")
    args = parser.parse_args(argv)
    if args.quick:
        return run(500, 100, windows=args.windows)
    return run(args.checks, args.sample, windows=args.windows)


if __name__ == "__main__":
    command_line(main)
