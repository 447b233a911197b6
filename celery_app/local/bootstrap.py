"""The checkbeat-specific steps of ``checkbeat up``: Redis, environment, demo data, the view.

Kept apart from :mod:`celery_app.local.up` (which only starts and stops processes) so the order
of things reads top to bottom: environment first (the app is built from it), then the
children, then the demo data, then the watch loop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_app.checks.store import CheckStore
from celery_app.errors import CheckExists
from celery_app.factory import create_app, settings_of
from celery_app.local.embedded_redis import RedisServer
from celery_app.local.lateness import LatenessWindow
from celery_app.local.status import collect_status, write_env_file
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.settings import load_settings

if TYPE_CHECKING:
    from celery_app.local.up import Stack, UpOptions

DEMO_REGIONS = ("eu", "us")
DEMO_TENANTS = {"acme": 2, "globex": 0}  # tenant -> plan weight
DEMO_TASKS_MODULE = "celery_app.local.demo_tasks"
# (name, path, period s): fast ones stay fast, /slow drifts to the slow lane.
DEMO_CHECKS = (
    ("home", "/fast", 10),
    ("api", "/fast?ms=60", 10),
    ("login", "/fast?ms=120", 15),
    ("flaky", "/flaky", 10),
    ("flapping", "/flapping", 5),
    ("report", "/slow", 20),
    ("hang", "/timeout", 30),
)
#: Per-check state thresholds of the demo: /flaky's random failures rarely reach 3 in a row;
#: /flapping's 20 s outages do, and its recovery needs 2 successes in a row.
DEMO_THRESHOLDS: dict[str, dict[str, Any]] = {
    "flaky": {"failure_threshold": 3, "success_threshold": 1},
    "flapping": {"failure_threshold": 2, "success_threshold": 2},
}


def prepare_environment(options: UpOptions, stack: Stack, echo: Callable[[str], None]) -> dict:
    """Redis (given or embedded) and the CHECKBEAT_* variables every child must share."""
    extra: dict[str, str] = {}
    url = os.environ.get("CHECKBEAT_REDIS_URL")
    if not url:
        server = RedisServer(options.data_dir / "redis", appendonly=True).start()
        stack.redis = server
        url = server.url(0)
        echo(f"redis: embedded redis-server on 127.0.0.1:{server.port} (data in {server.data_dir})")
    else:
        echo("redis: CHECKBEAT_REDIS_URL")
    extra["CHECKBEAT_REDIS_URL"] = url
    extra.setdefault("CHECKBEAT_BROKER_URL", os.environ.get("CHECKBEAT_BROKER_URL", url))
    if options.demo:
        from celery_app.local.demo_target import DemoTarget

        target = DemoTarget().start()
        stack.demo_target = target
        echo(f"demo target: {target.base_url}")
        extra["CHECKBEAT_REGIONS"] = ",".join(DEMO_REGIONS)
        imports = [p for p in os.environ.get("CHECKBEAT_IMPORTS", "").split(",") if p]
        extra["CHECKBEAT_IMPORTS"] = ",".join([*imports, DEMO_TASKS_MODULE])
        # The demo target is on loopback: allow exactly that address, not private ranges.
        extra["CHECKBEAT_ALLOWED_TARGET_ADDRESSES"] = "127.0.0.1"
    os.environ.update(extra)
    stack.app = fresh_app()
    stack.regions = tuple(settings_of(stack.app).regions)
    write_env_file(options.data_dir, os.environ)
    return extra


def fresh_app() -> Celery:
    """A Celery app built from the environment as it is now.

    ``up`` and ``status`` learn which Redis to use only after the process started, so they read
    the environment again here instead of using ``celery_app.app`` (or the settings cached by
    ``get_settings``).
    """
    app = create_app(load_settings())
    app.loader.import_default_modules()  # kinds, run task, CHECKBEAT_IMPORTS (cron tasks)
    return app


def add_demo_data(stack: Stack, echo: Callable[[str], None]) -> None:
    """Demo tenants and checks, created once (a restart keeps what the embedded Redis has)."""
    settings = settings_of(stack.app)
    client = get_redis(settings.redis_url, settings)
    client.sadd(state_keys(settings).tenants(), *DEMO_TENANTS)
    store = CheckStore.for_app(stack.app)
    base = stack.demo_target.base_url  # type: ignore[union-attr]  # called with the demo on
    created = 0
    for tenant, weight in DEMO_TENANTS.items():
        for name, path, period in DEMO_CHECKS:
            try:
                store.create(
                    uid=f"{tenant}-{name}",
                    tenant=tenant,
                    kind="http",
                    target=base + path,
                    period=period,
                    regions=list(DEMO_REGIONS),
                    plan_weight=weight,
                    **DEMO_THRESHOLDS.get(name, {}),
                )
                created += 1
            except CheckExists:
                store.update(
                    f"{tenant}-{name}", target=base + path, **DEMO_THRESHOLDS.get(name, {})
                )
    echo(f"demo: {created} new checks over tenants {', '.join(DEMO_TENANTS)}")


def before_start(options: UpOptions, stack: Stack, echo: Callable[[str], None]) -> None:
    """Seed the demo before beat starts, so its first window already sees the tenants."""
    if options.demo:
        add_demo_data(stack, echo)


def watch(
    options: UpOptions, stack: Stack, stop: threading.Event, echo: Callable[[str], None]
) -> int:
    """Until stopped: check the children every beat of the refresh and redraw the view."""
    if not options.view:
        echo("running; Ctrl-C stops everything")
        while not stop.wait(options.refresh):
            stack.supervisor.check()
        return 0
    from rich.console import Console
    from rich.live import Live

    from celery_app.local.view import render

    console = Console()
    lateness = LatenessWindow()
    with Live(console=console, refresh_per_second=4, screen=False) as live:
        while not stop.is_set():
            stack.supervisor.check()
            try:
                live.update(render(collect_status(stack.app, lateness)))
            except Exception as exc:
                live.update(f"status unavailable: {exc}")
            stop.wait(options.refresh)
    return 0
