"""The Celery application every checkbeat process shares: beat, workers and the CLI.

``celery -A celery_app ...`` finds ``celery_app.app``. The configuration comes from
:mod:`celery_app.settings`; user modules named in ``CHECKBEAT_IMPORTS`` are imported with the
app, so their cron tasks and check kinds are registered (and a bad cron spec fails every command).
"""

from __future__ import annotations

from celery import Celery

from celery_app.redis.tls import broker_use_ssl
from celery_app.settings import Settings, get_settings
from celery_app.worker_options import install_worker_options

#: Modules of checkbeat itself whose tasks every worker must know.
#: The cron-run recording (signal handlers) is one of them: any worker may run a cron task.
BUILTIN_TASK_MODULES: tuple[str, ...] = (
    "workers.probes",
    "workers.tasks",
    "celery_app.cron_tasks.recording",
)


def create_app(settings: Settings | None = None) -> Celery:
    """Build a configured Celery app (one per process; tests may build their own).

    Without ``settings`` the environment's are used (:func:`~celery_app.settings.get_settings`);
    either way the app carries them and nothing built from it reads the environment again.
    """
    if settings is None:
        settings = get_settings()
    app = Celery("checkbeat", broker=settings.effective_broker_url, set_as_current=True)
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
        broker_transport_options={"visibility_timeout": 3600},
        # Flower shows tasks only when workers send events.
        worker_send_task_events=True,
        task_send_sent_event=True,
        beat_scheduler="beat:CronScheduler",
        # A cron task's declared queue is applied by a router, not the deprecated attribute.
        task_routes=["celery_app.cron_tasks.registration.route_cron_task"],
        imports=[*BUILTIN_TASK_MODULES, *settings.imports],
        checkbeat_settings=settings,
    )
    install_worker_options(app)
    return app


def settings_of(app: Celery) -> Settings:
    """The Settings an app was built with.

    An app built by :func:`create_app` carries its settings, so this never reads the
    environment again: everything below the app takes its configuration from here. Only an app
    built some other way (a user's own ``Celery(...)`` with checkbeat's tasks) falls back to the
    environment, read once per process by :func:`~celery_app.settings.get_settings`.
    """
    settings = app.conf.get("checkbeat_settings")
    return settings if settings is not None else get_settings()
