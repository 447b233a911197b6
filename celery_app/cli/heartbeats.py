"""``celery -A proj checks ping UID`` and ``checks serve-pings``: heartbeat checks from a shell
(docs/heartbeats.md)."""

from __future__ import annotations

import sys

import click

from celery_app.checks.heartbeat import MAX_PING_BODY, PingKind, PingRefused, ping
from celery_app.cli.common import BadInput, load_app


@click.command("ping")
@click.argument("uid")
@click.option("--start", "kind", flag_value=PingKind.START.value, help="The job started.")
@click.option("--fail", "kind", flag_value=PingKind.FAIL.value, help="The job failed.")
@click.option("--exit-status", type=int, default=None, help="The job's exit status.")
@click.option("--duration", type=float, default=None, help="The run's duration in seconds.")
@click.option(
    "--body",
    default="",
    help=f"What the job says (a log tail; '-' reads stdin), at most {MAX_PING_BODY:,} characters.",
)
@click.pass_context
def ping_command(
    ctx: click.Context,
    uid: str,
    kind: str | None,
    exit_status: int | None,
    duration: float | None,
    body: str,
) -> None:
    """Ping heartbeat check UID: it ran (default), --start or --fail."""
    if body == "-":
        body = sys.stdin.read(MAX_PING_BODY + 1)
    try:
        done = ping(
            load_app(ctx),
            uid,
            kind or PingKind.SUCCESS.value,
            exit_status=exit_status,
            duration_s=duration,
            body=body,
        )
    except PingRefused as exc:
        raise BadInput(str(exc)) from None
    made = f", transition(s) {', '.join(done.transitions)}" if done.transitions else ""
    click.echo(f"{done.kind} ping of {uid} recorded{made}")


@click.command("serve-pings")
@click.option("--bind", default="127.0.0.1:8090", show_default=True, help="HOST:PORT to listen on.")
@click.pass_context
def serve_pings(ctx: click.Context, bind: str) -> None:
    """Serve heartbeat pings over HTTP: /ping/UID/TOKEN[/start|/fail|/EXIT_STATUS]."""
    from celery_app.checks.ping_server import parse_bind, serve

    try:
        host, port = parse_bind(bind)
    except ValueError as exc:
        raise BadInput(f"--bind: {exc}") from None
    serve(load_app(ctx), host, port)


@click.command("ping-url")
@click.argument("uid")
@click.option(
    "--base",
    default="",
    help="Where the ping endpoint is reached (https://pings.example.com); default: the path only.",
)
@click.pass_context
def ping_url(ctx: click.Context, uid: str, base: str) -> None:
    """Print heartbeat check UID's ping URL, its secret token in it (for the job's script)."""
    from celery_app.checks.ping_server import ping_path
    from celery_app.cli.common import check_store
    from celery_app.errors import CheckNotFound

    try:
        stored = check_store(ctx).require(uid)
    except CheckNotFound as exc:
        raise click.ClickException(str(exc)) from None
    token = stored.definition.config.get("token")
    if stored.definition.heartbeat() is None or not isinstance(token, str):
        raise BadInput(f"uid: {uid!r} is not a heartbeat check (kind {stored.definition.kind})")
    click.echo(base.rstrip("/") + ping_path(uid, token))
