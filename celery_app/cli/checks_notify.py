"""``checks notify add|rm|list|test``: the notification targets of a check or of a tenant
(docs/notifications.md; ``rm`` and ``list`` as ``checks maintenance``'s: ``scoped.py``). A URL
is shown with its secrets masked (``shown_url``); ``test`` sends a made-up transition from this
process (not through the queue), to see a URL work."""

from __future__ import annotations

import json
import time

import click

from celery_app.checks.notify import NotifyStore, scrubbed_error, validate_target
from celery_app.checks.notify_send import send
from celery_app.checks.transitions import Transition
from celery_app.cli.common import CheckbeatGroup, check_store
from celery_app.cli.scoped import add_scoped, scope_options, scoped_commands
from celery_app.cli.terminal import escape
from celery_app.redis.schema import TransitionField


@click.group(name="notify", cls=CheckbeatGroup)
def notify() -> None:
    """Notification targets: every transition of a check is sent to its own and its tenant's."""


@notify.command("add")
@scope_options(
    "The check whose transitions are sent.", "The tenant whose checks' transitions are sent."
)
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
    store = check_store(ctx)
    target = add_scoped(
        NotifyStore(store.redis, store.keys),
        lambda: validate_target(uid=uid, tenant=tenant, url=url, target_id=target_id),
    )
    click.echo(f"added target {target.id} to {escape(target.scope)}: {escape(target.shown)}")


scoped_commands(
    notify,
    NotifyStore,
    noun="notification target",
    short="target",
    list_help="List notification targets, secrets masked.",
    rows=lambda targets: [t.as_dict() for t in targets],
    header=f"{'ID':12} {'SCOPE':28} URL",
    line=lambda t: f"{escape(t['id']):12} {escape(t['scope']):28} {escape(t['url'])}",
)


@notify.command("test")
@click.argument("target_id")
@click.pass_context
def test(ctx: click.Context, target_id: str) -> None:
    """Send a made-up transition (up -> down, id <uid>#test) to target TARGET_ID now; exit 1
    with the error when the send fails."""
    store = check_store(ctx)
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
