"""Helpers shared by the subcommands: load the user's modules, and one way of failing to run.

Every subcommand of ``schedule``, ``checks`` and ``tenants`` is a :class:`CheckbeatCommand` (their
groups' ``command_class``), so each reports the same way that it cannot run at all: an
unreachable Redis or broker, an invalid configuration, or a project module named like one of
checkbeat's packages, is one line on stderr naming the URL (password masked), the variable or
both modules, and exit code 2. Bad input (a field out of its bounds, a
checks file refused) is one line naming the field and what is allowed, exit code 2 as well, as
click's own usage errors: :class:`BadInput`. Exit code 1 keeps its meaning per command: it ran,
and refused a request (a uid taken or unknown) or reports a problem (every ``diagnose`` exits 1
when it reports anything).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click
import redis
from celery import Celery
from celery.bin.base import CeleryCommand
from kombu.exceptions import OperationalError

from celery_app.factory import settings_of
from celery_app.settings import Settings, SettingsError, redact_url
from celery_app.shadowing import app_clashes

#: Exit code of a command that could not run: Redis or the broker unreachable, bad settings.
EXIT_CANNOT_RUN = 2
#: Exit code of a command that ran and reports a problem (diagnose findings, a refused request).
EXIT_PROBLEM = 1


#: Exit code of a command given bad input (as click's usage errors): nothing was written.
EXIT_BAD_INPUT = 2

#: ``--json`` of both ``diagnose`` commands: their findings as one JSON list (``findings_json``).
findings_json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Findings as a JSON list of kind, subject, message, since.",
)


class CannotRun(click.ClickException):
    """The command could not do its job at all; click prints ``Error: <message>``."""

    exit_code = EXIT_CANNOT_RUN


if TYPE_CHECKING:
    from celery_app.checks.store import CheckStore

Row = TypeVar("Row")


class BadInput(click.ClickException):
    """An option, argument or file was refused (``<field>: <what is wrong> (<allowed>)``);
    nothing was written."""

    exit_code = EXIT_BAD_INPUT


def load_app(ctx: click.Context) -> Celery:
    """The ``-A`` app with the user modules (CHECKBEAT_IMPORTS) imported, so their cron tasks,
    providers and check kinds exist; a bad declaration fails the command with its message."""
    app = ctx.obj.app
    try:
        app.loader.import_default_modules()
    except SettingsError:
        raise  # cannot run: reported by CheckbeatCommand
    except ValueError as exc:  # CronSpecError, TenantError, CheckFieldError
        raise click.ClickException(str(exc)) from None
    return app


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in the operating system's words when it gave any."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, redis.TimeoutError):
        return "timed out"
    return str(exc).strip().rstrip(".") or type(exc).__name__


def _endpoint(url: str) -> str:
    parts = urlsplit(url)
    try:
        return f"{parts.hostname}:{parts.port or 6379}"
    except ValueError:  # redis+cluster://h:p,h:p has no one port
        return parts.netloc


def redis_unreachable(exc: redis.RedisError, settings: Settings) -> str:
    """The one line for a Redis connection that failed: which URL, why, which variable."""
    variable, url = "CHECKBEAT_REDIS_URL", settings.redis_url
    broker = settings.effective_broker_url
    if settings.broker_url and _endpoint(broker) in str(exc) and _endpoint(url) not in str(exc):
        variable, url = "CHECKBEAT_BROKER_URL", broker
    if isinstance(exc, redis.AuthenticationError):
        return f"Redis at {redact_url(url)} refused the credentials ({exc}); check {variable}"
    from celery_app.redis.tls_diagnosis import certificate_problem

    problem = certificate_problem(exc, url, settings)
    if problem:
        return f"cannot reach Redis at {redact_url(url)} ({variable}): {problem}"
    return f"cannot reach Redis at {redact_url(url)} ({_reason(exc)}); is it running? ({variable})"


def broker_unreachable(exc: BaseException, settings: Settings) -> str:
    variable = "CHECKBEAT_BROKER_URL" if settings.broker_url else "CHECKBEAT_REDIS_URL"
    url = redact_url(settings.effective_broker_url)
    return f"cannot reach the broker at {url} ({_reason(exc)}); is it running? ({variable})"


def settings_invalid(exc: SettingsError) -> str:
    """The settings error on one line: ``invalid checkbeat configuration: A=..: why; B=..: why``."""
    head, *lines = str(exc).splitlines()
    return f"{head} {'; '.join(line.strip() for line in lines)}".strip()


@contextmanager
def reported_as_cannot_run(settings: Callable[[], Settings]) -> Iterator[None]:
    """Turn an unreachable Redis or broker, invalid settings, or a schedule that cannot be
    loaded (broken ``beat_schedule`` entries, a task id declared twice) into :class:`CannotRun`;
    ``settings`` (called only then) tells which URLs the command used."""
    try:
        yield
    except SettingsError as exc:
        raise CannotRun(settings_invalid(exc)) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise CannotRun(redis_unreachable(exc, settings())) from None
    except OperationalError as exc:  # kombu: the broker connection
        raise CannotRun(broker_unreachable(exc, settings())) from None
    except ValueError as exc:
        from celery_app.cron_tasks.celery_schedules import BeatEntryError
        from celery_app.cron_tasks.registration import CronSpecError

        if isinstance(exc, (BeatEntryError, CronSpecError)):  # the schedule cannot be loaded
            raise CannotRun(str(exc)) from None  # every entry named, one line each
        raise


def refuse_name_clashes(app: Celery) -> None:
    """A project module named like a checkbeat package (``beat.py``, ``workers/``,
    ``celery_app.py``) cannot run: one line per clash, naming both, and exit 2. The packages
    checked are those the project's beat and workers import (:func:`shadowing.needed_by`)."""
    found = app_clashes(app, runs_beat=True)
    if found:
        raise CannotRun("\nError: ".join(str(clash) for clash in found))


#: The most entries a listing option (``--results``, ``--count``) may ask for.
MAX_LISTED = 10_000


class CheckbeatCommand(CeleryCommand):
    """A Celery subcommand whose body reports "cannot run" plainly, with exit code 2, and whose
    options, when click refuses one (a number out of its range, a missing option), are one
    line naming it, exit code 2 (click's own report adds the usage and a help hint)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise BadInput(exc.format_message()) from None

    def invoke(self, ctx: click.Context) -> Any:
        refuse_name_clashes(ctx.obj.app)
        with reported_as_cannot_run(lambda: settings_of(ctx.obj.app)):
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:  # options that do not go together
                raise BadInput(exc.format_message()) from None


class CheckbeatGroup(click.Group):
    """A group of :class:`CheckbeatCommand` subcommands."""

    command_class = CheckbeatCommand


def check_store(ctx: click.Context) -> CheckStore:
    """The ``-A`` app's check store, its user modules imported first (:func:`load_app`: every
    kind, built-in or the project's, is registered before a definition is validated), once
    the partition count of the check half is the one it was built with (else one line naming
    the setting, exit 2)."""
    from celery_app.checks.layout import PartitionLayoutError, ensure_layout
    from celery_app.checks.store import CheckStore

    store = CheckStore.for_app(load_app(ctx))
    try:
        ensure_layout(store.redis, store.keys, record=False)
    except PartitionLayoutError as exc:
        raise BadInput(str(exc)) from None
    return store


# --- listing ------------------------------------------------------------------------------------


def echo_rows(
    rows: Sequence[Row],
    as_json: bool,
    *,
    none: str,
    line: Callable[[Row], str],
    header: str | None = None,
    as_dict: Callable[[Row], Any] | None = None,
) -> None:
    """What a list command prints: with ``--json`` its rows as one JSON list (each row's
    ``as_dict``, else the row itself), else ``none`` when there is no row, else ``header`` and
    each row's ``line``."""
    if as_json:
        click.echo(json.dumps([as_dict(r) for r in rows] if as_dict else list(rows), indent=2))
        return
    if not rows:
        click.echo(none)
        return
    if header is not None:
        click.echo(header)
    for row in rows:
        click.echo(line(row))
