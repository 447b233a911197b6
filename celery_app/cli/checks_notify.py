"""``checks notify add|rm|list|test``: the notification targets of a check or of a tenant
(docs/notifications.md). A URL is shown with its secrets masked (``shown_url``); ``test`` sends
a made-up transition from this process (not through the queue), to see a URL work."""

from __future__ import annotations

import json
import time

import click

from celery_app.checks.notify import NotifyStore, scrubbed_error, validate_target
from celery_app.checks.notify_send import send
from celery_app.checks.store import CheckStore
from celery_app.checks.transitions import Transition
from celery_app.cli.common import BadInput, CheckbeatGroup, check_store, load_app
from celery_app.cli.terminal import escape
from celery_app.errors import CheckFieldError, CheckNotFound
from celery_app.redis.schema import TransitionField, maintenance_scope


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


@notify.command("test")
@click.argument("target_id")
@click.pass_context
def test(ctx: click.Context, target_id: str) -> None:
    """Send a made-up transition (up -> down, id <uid>#test) to target TARGET_ID now; exit 1
    with the error when the send fails."""
    store = _store(ctx)
    found = [t for t in NotifyStore(store.redis, store.keys).list() if t.id == target_id]
    if not found:
        raise click.ClickException(f"no notification target with id {target_id!r}")
    target = found[0]
    kind, _, name = target.scope.partition(":")
    uid, tenant = (name, "") if kind == "check" else ("checkbeat-test", name)
    if kind == "check":
        stored = store.get(uid)
        tenant = stored.definition.tenant if stored is not None else ""
    transition = Transition(
        id=f"{uid}#test", uid=uid, tenant=tenant, from_state="up", to_state="down",
        at=time.time(),
    )  # fmt: skip
    payload = json.dumps(
        {
            TransitionField.ID: transition.id,
            TransitionField.UID: uid,
            TransitionField.TENANT: tenant,
            TransitionField.FROM: transition.from_state,
            TransitionField.TO: transition.to_state,
            TransitionField.AT: transition.at,
            TransitionField.HELD: False,
            TransitionField.REGIONS: {},
        }
    )
    try:
        send(target, transition, payload, timeout=store.settings.transition_timeout)
    except Exception as exc:  # any failure of the send is the answer: one line, scrubbed
        error = scrubbed_error(f"{type(exc).__name__}: {exc}", target)
        raise click.ClickException(f"not sent to {target.shown}: {error}") from None
    click.echo(f"sent {transition.id} to {escape(target.shown)}")
