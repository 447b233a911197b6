"""Celery apps that run checkbeat: the ready-made one, and the user's own.

``celery -A celery_app ...`` finds ``celery_app.app``, built by :func:`create_app` from the
environment; user modules named in ``CHECKBEAT_IMPORTS`` are imported with the app, so their cron
tasks and check kinds are registered (and a bad cron spec fails every command).

A user's own app (``celery -A proj ...``) is adopted instead: ``beat_scheduler =
"beat:CronScheduler"`` alone fires its cron tasks, and :func:`install` adds what workers need to
run checks. Its settings are read from its ``app.conf.checkbeat_*`` keys with the environment
overriding (:func:`settings_of`), once, at first use.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from typing import Any, cast

from celery import Celery, signals

from celery_app.redis.kombu_redis import register as register_redis_transport
from celery_app.redis.kombu_sentinel import register as register_sentinel_transport
from celery_app.redis.sentinel import broker_transport_options, is_sentinel_url, kombu_url
from celery_app.redis.tls import broker_use_ssl
from celery_app.settings import (
    CONF_PREFIX,
    SETTINGS_CONF_KEY,
    ConfEntry,
    Settings,
    SettingsError,
    conf_values,
    get_settings,
    load_settings,
    with_app_defaults,
)
from celery_app.worker_options import install_worker_options
from scheduling_core import Params

#: Modules of checkbeat itself whose tasks every worker must know.
#: The cron-run recording (signal handlers) is one of them: any worker may run a cron task.
BUILTIN_TASK_MODULES: tuple[str, ...] = (
    "workers.probes",
    "workers.tasks",
    "workers.deliver_transition",
    "workers.heartbeat_ping",
    "celery_app.cron_tasks.recording",
)
#: The beat scheduler that fires cron tasks and dispatches checks.
BEAT_SCHEDULER = "beat:CronScheduler"
#: A cron task's declared queue is applied by a router, not the deprecated attribute.
CRON_ROUTER = "celery_app.cron_tasks.registration.route_cron_task"
#: Broker schemes whose URL can also hold checkbeat's state when no Redis URL is given.
_REDIS_SCHEMES = ("redis", "rediss", "sentinel")
#: What Celery's ``accept_content`` must allow: check messages are JSON.
_JSON = ("json", "application/json")

_INSTALLED = "_checkbeat_installed"
_settings_lock = threading.Lock()


def create_app(settings: Settings | None = None) -> Celery:
    """Build a configured Celery app (one per process; tests may build their own).

    Without ``settings`` the environment's are used (:func:`~celery_app.settings.get_settings`);
    either way the app carries them and nothing built from it reads the environment again.
    """
    if settings is None:
        settings = get_settings()
    broker = settings.effective_broker_url
    register_redis_transport()
    if is_sentinel_url(broker):
        broker = kombu_url(broker)  # kombu reads the database from the first address only
        register_sentinel_transport()
    app = Celery("checkbeat", broker=broker, set_as_current=True)
    app.conf.update(
        # JSON only: a pickle message from a compromised producer is code execution.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        # State lives in checkbeat's own Redis keys, not in a result backend.
        task_ignore_result=True,
        result_backend=None,
        timezone=settings.timezone,
        enable_utc=True,
        # A worker holds only what it runs: the backlog waits in Redis, in fair order.
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        broker_connection_retry_on_startup=True,
        # Never give up on the broker: Celery's default (100 retries, about 45 min) would leave
        # a worker exited after a long outage, and the lanes short of slots when it returns.
        broker_connection_max_retries=None,
        # rediss:// brokers verify the server certificate (kombu alone would use CERT_NONE).
        broker_use_ssl=broker_use_ssl(settings),
        # A sentinel:// broker adds master_name and the Sentinels' own options.
        broker_transport_options={"visibility_timeout": 3600, **broker_transport_options(settings)},
        # Flower shows tasks only when workers send events.
        worker_send_task_events=True,
        task_send_sent_event=True,
        beat_scheduler=BEAT_SCHEDULER,
        task_routes=[CRON_ROUTER],
        imports=[*BUILTIN_TASK_MODULES, *settings.imports],
        **{SETTINGS_CONF_KEY: settings},
    )
    install_worker_options(app)
    return app


# --- settings of any app -----------------------------------------------------------------------
_params: dict[int, tuple[Settings, Params]] = {}


def params_of(settings: Settings) -> Params:
    """The scheduling ``Params`` of ``settings``, built once per settings object: a run needs
    them twice (its ceiling, its post-exec fold), and building them reads every field."""
    kept = _params.get(id(settings))
    if kept is None or kept[0] is not settings:
        kept = _params[id(settings)] = (settings, Params.from_settings(settings))
    return kept[1]


def settings_of(app: Celery) -> Settings:
    """The Settings of an app, so everything below the app takes its configuration from here.

    An app built by :func:`create_app` carries the settings it was built with. Any other app's
    are read from its conf (``app.conf.checkbeat_*``) and the environment on first use, then kept
    in ``app.conf.checkbeat_settings``: a ``checkbeat_*`` key changed later is not seen.
    """
    settings = app.conf.get(SETTINGS_CONF_KEY)
    if settings is None:
        with _settings_lock:
            settings = app.conf.get(SETTINGS_CONF_KEY)
            if settings is None:
                try:
                    settings = settings_from_conf(app)
                except SettingsError as exc:
                    exit_under_celery_cli(exc)
                    raise
                app.conf[SETTINGS_CONF_KEY] = settings
    return cast(Settings, settings)  # the key holds only what create_app or this function put


def loaded_by_celery_cli() -> bool:
    """Whether Celery's own command line (``celery -A ... ``) is running this process."""
    cli = sys.modules.get("celery.bin.celery")
    if cli is None:
        return False
    import click

    context = click.get_current_context(silent=True)
    return context is not None and context.find_root().command is cli.celery


def exit_under_celery_cli(exc: SettingsError) -> None:
    """Under Celery's CLI, print a SettingsError as the one message it is and exit with status 2,
    like a usage error; elsewhere return (the caller re-raises).

    SystemExit because it is a BaseException: Celery's app loader, its signal dispatch and the
    worker's start-up turn every Exception into a traceback of their own.
    """
    if loaded_by_celery_cli():
        print(f"Error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def settings_from_conf(app: Celery) -> Settings:
    """Read a user app's settings: the environment over its ``checkbeat_*`` keys over defaults.

    The app's own configuration decides what checkbeat must agree with: its ``broker_url`` is
    the broker (``checkbeat_broker_url`` is refused, ``CHECKBEAT_BROKER_URL`` is not used), a
    ``redis://``/``rediss://``/``sentinel://`` broker also holds checkbeat's state unless a
    Redis URL is given (a Sentinel broker's ``master_name`` transport option is then the
    Sentinel master too), and its ``timezone`` is the default timezone of cron tasks.
    """
    conf = app.conf
    given = conf_values(_checkbeat_entries(app))
    if "broker_url" in given.values:
        raise SettingsError(
            f"invalid checkbeat configuration:\n  {given.names['broker_url']}: your app sends "
            "through its own broker_url; set app.conf.broker_url instead"
        )
    _require_json(app)
    broker = conf.broker_url
    master = (conf.broker_transport_options or {}).get("master_name")
    implied = with_app_defaults(
        given,
        state_url=broker if broker and broker.split("://", 1)[0] in _REDIS_SCHEMES else None,
        sentinel_master=master if is_sentinel_url(broker) else None,
        timezone=str(conf.timezone) if conf.timezone else None,
    )
    return load_settings(implied, broker_url=broker)


def _checkbeat_entries(app: Celery) -> Iterator[ConfEntry]:
    """The conf keys in checkbeat's namespace, also under the app's own Celery namespace
    (``Celery(namespace="CELERY")`` reads ``CELERY_CHECKBEAT_POOL_SIZE``)."""
    namespace = app.namespace  # type: ignore[attr-defined]  # not in celery-types' Celery
    namespace = f"{namespace.rstrip('_')}_".lower() if namespace else ""
    conf = app.conf
    for key in list(conf.keys()):
        if not isinstance(key, str):
            continue
        bare = key[len(namespace) :] if namespace and key.lower().startswith(namespace) else key
        if bare.lower().startswith(CONF_PREFIX):
            yield ConfEntry(f"app.conf.{key}", bare, conf[key])


def _require_json(app: Celery) -> None:
    """Refuse an app whose workers would reject checkbeat's JSON check messages."""
    accepted = app.conf.accept_content
    accepted = [accepted] if isinstance(accepted, str) else list(accepted or ())
    if not any(kind in _JSON for kind in accepted):
        raise SettingsError(
            f"invalid checkbeat configuration:\n  app.conf.accept_content={accepted!r}: "
            "checkbeat's check messages are JSON; include 'json' (Celery's default is ['json'])"
        )


# --- adopting a user's app ---------------------------------------------------------------------
def install(app: Celery) -> Celery:
    """Make ``app`` run checkbeat's checks as well: the one call a user's own app needs.

    Adds, without replacing anything the app configures:

    * checkbeat's task modules (probes, ``run_check``, cron-run recording) and the modules of
      ``checkbeat_imports``, imported wherever the app imports its own (worker, beat, CLI);
    * ``celery worker --role fast|shared --region R`` and the capacity bootstep;
    * the cron router, first in ``task_routes`` (it answers only for cron tasks that declare a
      ``queue``, so the app's own routes still decide everything else);
    * ``beat_scheduler = "beat:CronScheduler"`` unless the app chose a scheduler.

    Serializers are left alone: Celery's defaults are already JSON only, forcing them would break
    the app's own tasks that chose otherwise, and on a Redis broker checkbeat writes its check
    messages as JSON whatever the app's ``task_serializer``; an app whose ``accept_content``
    excludes JSON is refused at first use (its workers would reject every check). Safe to call
    before or after the app is configured, and more than once. Returns ``app``.
    """
    if getattr(app, _INSTALLED, False):
        return app
    setattr(app, _INSTALLED, True)
    register_sentinel_transport()  # a sentinel:// broker then follows a failover
    register_redis_transport()  # one redis-py client per broker pool, not one per message
    install_worker_options(app)
    app.on_after_configure.connect(_complete_conf, weak=False, dispatch_uid="checkbeat.install")
    if app.configured:  # type: ignore[attr-defined]  # not in celery-types' Celery
        _complete_conf(app)
    return app


def installed(app: Celery) -> bool:
    """Whether :func:`install` was called on ``app`` (its workers then import checkbeat's
    task modules, the cron-run recording among them)."""
    return bool(getattr(app, _INSTALLED, False))


def app_modules(app: Any) -> list[str]:
    """The modules ``app`` names in its ``imports`` and ``include`` settings."""
    conf = app.conf
    found: list[str] = []
    for key in ("imports", "include"):
        value = conf.get(key) or ()
        found.extend([value] if isinstance(value, str) else list(value))
    return [m for m in found if isinstance(m, str)]


def runs_checkbeat_tasks(app: Any) -> bool:
    """Whether the workers of ``app`` know checkbeat's tasks (a check's run, a transition's
    delivery): :func:`install` was called, or the app imports them itself (checkbeat's own
    app). A project that only set ``beat_scheduler`` has plain workers: a transition sent to
    them would be discarded as an unregistered task."""
    workers = {m for m in BUILTIN_TASK_MODULES if m.startswith("workers.")}
    return installed(app) or bool(set(app_modules(app)) & workers)


def _complete_conf(sender: Celery, **_: Any) -> None:
    """Add the cron router and the scheduler to a configured app (again after a reload)."""
    conf = sender.conf
    given = conf.task_routes
    routes = [] if given is None else list(given) if isinstance(given, list | tuple) else [given]
    if CRON_ROUTER not in routes:
        conf.task_routes = [CRON_ROUTER, *routes]
    if not conf.value_set_for("beat_scheduler"):
        conf.beat_scheduler = BEAT_SCHEDULER


@signals.import_modules.connect(weak=False)
def _import_checkbeat_modules(sender: Any = None, **_: Any) -> None:
    """Before an installed app imports its task modules, import checkbeat's and the user's
    ``checkbeat_imports`` (reading its settings there, so a bad value fails the command).

    First, in a ``celery beat`` or ``celery worker`` process, a project module named like one of
    checkbeat's packages is refused, one line each and exit 2: beat would otherwise fail later
    resolving ``beat:CronScheduler``, a worker importing ``workers.*``, with import errors that
    name neither module (:mod:`celery_app.shadowing`)."""
    if sender is None:
        return
    _refuse_name_clashes(sender)
    if not getattr(sender, _INSTALLED, False):
        return
    for module in (*BUILTIN_TASK_MODULES, *settings_of(sender).imports):
        importlib.import_module(module)


def _refuse_name_clashes(app: Celery) -> None:
    """Exit 2 naming each clash, when this is Celery's ``beat`` or ``worker`` command."""
    if not loaded_by_celery_cli():
        return
    import click

    from celery_app.shadowing import app_clashes

    context = click.get_current_context(silent=True)
    if context is None or context.info_name not in ("beat", "worker"):
        return  # checkbeat's subcommands check in CheckbeatCommand
    runs_beat = context.info_name == "beat" or bool(context.params.get("beat"))
    found = app_clashes(app, runs_beat=runs_beat)
    if found:
        for clash in found:
            print(f"Error: {clash}", file=sys.stderr)
        raise SystemExit(2)
