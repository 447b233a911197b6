"""``checks notify add|rm|list``: the notification targets of a check or of a tenant
(docs/notifications.md). A URL is shown with its secrets masked (``shown_url``)."""

from __future__ import annotations

import json

import click

from celery_app.checks.notify import NotifyStore, validate_target
from celery_app.checks.store import CheckStore
from celery_app.cli.common import BadInput, CheckbeatGroup, check_store, load_app
from celery_app.cli.terminal import escape
from celery_app.errors import CheckFieldError, CheckNotFound
from celery_app.redis.schema import maintenance_scope


def _store(ctx: click.Context) -> CheckStore:
    return check_store(load_app(ctx))


@click.group(name="notify", cls=CheckbeatGroup)
def notify() -> None:
    """Notification targets: every transition of a check is sent to its own and its tenant's."""


@notify.command("add")
@click.option("--check", "uid", help="The check whose transitions are sent.")
@click.option("--tenant", help="The tenant whose checks' transitions are sent.")
@click.option(
    "--url",
    required=True,
    help="An Apprise URL (slack://, msteams://, discord://, tgram://, mailto://, json://, ...) "
    "or checkbeat+webhooks://host/path?secret=... (a signed JSON webhook).",
)
@click.option("--id", "target_id", help="The target's id (default: generated).")
@click.pass_context
def add(
    ctx: click.Context, uid: str | None, tenant: str | None, url: str, target_id: str | None
) -> None:
    """Add a target to a check (--check) or to all of a tenant's checks (--tenant)."""
    store = _store(ctx)
    try:
        target = validate_target(uid=uid, tenant=tenant, url=url, target_id=target_id)
        NotifyStore(store.redis, store.keys).add(target)
    except CheckFieldError as exc:
        raise BadInput(str(exc)) from None
    except CheckNotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"added target {target.id} to {escape(target.scope)}: {escape(target.shown)}")


@notify.command("rm")
@click.argument("target_id")
@click.pass_context
def rm(ctx: click.Context, target_id: str) -> None:
    """Remove target TARGET_ID."""
    store = _store(ctx)
    if not NotifyStore(store.redis, store.keys).remove(target_id):
        raise click.ClickException(f"no notification target with id {target_id!r}")
    click.echo(f"removed target {escape(target_id)}")


@notify.command("list")
@click.option("--check", "uid", help="Only this check's own targets.")
@click.option("--tenant", help="Only this tenant's targets.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_targets(ctx: click.Context, uid: str | None, tenant: str | None, as_json: bool) -> None:
    """List notification targets, secrets masked."""
    store = _store(ctx)
    scope = None
    if uid or tenant:
        scope = maintenance_scope(uid=uid) if uid else maintenance_scope(tenant=tenant)
    rows = [t.as_dict() for t in NotifyStore(store.redis, store.keys).list(scope)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no notification targets")
        return
    click.echo(f"{'ID':12} {'SCOPE':28} URL")
    for t in rows:
        click.echo(f"{escape(t['id']):12} {escape(t['scope']):28} {escape(t['url'])}")
