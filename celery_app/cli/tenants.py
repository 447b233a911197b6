"""``celery -A celery_app tenants add|rm|list``: the Redis set of active tenants.

That set is the default tenants provider of per-tenant cron tasks (CHECKBEAT_TENANTS_PROVIDER
``auto`` without a registered provider, or ``redis``).
"""

from __future__ import annotations

from typing import cast

import click
import redis
from celery.bin.base import handle_preload_options

from celery_app.cli.common import BadInput, CheckbeatGroup
from celery_app.cli.terminal import escape
from celery_app.cron_tasks.tenants_provider import TenantError, validate_tenant
from celery_app.factory import settings_of
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys


def _set(ctx: click.Context) -> tuple[redis.Redis, str]:
    settings = settings_of(ctx.obj.app)
    return get_redis(settings.redis_url, settings), state_keys(settings).tenants()


@click.group(name="tenants", cls=CheckbeatGroup)
@click.pass_context
@handle_preload_options
def tenants(ctx: click.Context) -> None:
    """Manage the active tenants (the Redis set per-tenant cron tasks fan out to)."""


@tenants.command(name="add")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def add(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Add tenants (all names are validated before any is written)."""
    try:
        valid = [validate_tenant(n) for n in names]
    except TenantError as exc:
        raise BadInput(str(exc)) from None
    client, key = _set(ctx)
    added = client.sadd(key, *valid)
    click.echo(f"added {added} tenant(s); {client.scard(key)} active")


@tenants.command(name="rm")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def rm(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Remove tenants."""
    client, key = _set(ctx)
    removed = client.srem(key, *names)
    click.echo(f"removed {removed} tenant(s); {client.scard(key)} active")


@tenants.command(name="list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """List the active tenants, one per line."""
    client, key = _set(ctx)
    for name in sorted(cast("set[str]", client.smembers(key))):  # decode_responses=True
        click.echo(escape(name))
