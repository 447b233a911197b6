"""What ``checks maintenance`` and ``checks notify`` share: a check's or a tenant's windows and
notification targets are kept by one store (``checks/scoped_store.py``), so removing and listing
them are one pair of commands (:func:`scoped_commands`), and adding one fails the same way
(:func:`add_scoped`). Each group keeps its own ``add``: its options are what the item is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from celery_app.checks.scoped_store import Item, ScopedStore
from celery_app.cli.common import BadInput, check_store, echo_rows
from celery_app.cli.terminal import escape
from celery_app.errors import CheckFieldError, CheckNotFound
from celery_app.redis.schema import maintenance_scope

F = TypeVar("F", bound=Callable[..., Any])


def scope_options(check_help: str, tenant_help: str) -> Callable[[F], F]:
    """``--check UID`` and ``--tenant``: the scope a command adds to or lists."""

    def decorate(command: F) -> F:
        command = click.option("--tenant", help=tenant_help)(command)
        return click.option("--check", "uid", help=check_help)(command)

    return decorate


def add_scoped(store: ScopedStore[Any], validated: Callable[[], Item]) -> Item:
    """Store the item ``validated`` returns: a field it refuses is bad input (exit 2, nothing
    written), a check scope naming no check a refused request (exit 1)."""
    try:
        item = validated()
        store.add(item)
    except CheckFieldError as exc:
        raise BadInput(str(exc)) from None
    except CheckNotFound as exc:
        raise click.ClickException(str(exc)) from None
    return item


def scoped_commands(
    group: click.Group,
    store_type: Callable[[Any, Any], ScopedStore[Item]],
    *,
    noun: str,
    short: str,
    list_help: str,
    rows: Callable[[list[Item]], list[dict[str, Any]]],
    header: str,
    line: Callable[[dict[str, Any]], str],
) -> None:
    """Give ``group`` its ``rm`` (``<short> ID``, whatever its scope) and its ``list`` (every
    scope, or the one ``--check`` or ``--tenant`` names; ``rows`` the items as ``--json`` prints
    them and ``line`` prints one under ``header``). ``noun``: what an item is called."""

    @group.command("rm", help=f"Remove {short} {short.upper()}_ID.")
    @click.argument("item_id", metavar=f"{short.upper()}_ID")
    @click.pass_context
    def rm(ctx: click.Context, item_id: str) -> None:
        store = check_store(ctx)
        if not store_type(store.redis, store.keys).remove(item_id):
            raise click.ClickException(f"no {noun} with id {item_id!r}")
        click.echo(f"removed {short} {escape(item_id)}")

    @group.command("list", help=list_help)
    @scope_options(f"Only this check's own {short}s.", f"Only this tenant's {short}s.")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    @click.pass_context
    def list_items(ctx: click.Context, uid: str | None, tenant: str | None, as_json: bool) -> None:
        store = check_store(ctx)
        scope = None
        if uid or tenant:
            scope = maintenance_scope(uid=uid) if uid else maintenance_scope(tenant=tenant)
        listed = store_type(store.redis, store.keys).list(scope)
        echo_rows(rows(listed), as_json, none=f"no {noun}s", header=header, line=line)
