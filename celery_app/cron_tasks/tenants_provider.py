"""Where per-tenant cron tasks get their tenants.

Why a provider is read every window: tenants come and go, and a task fanned out to a stale list
would run for a deleted tenant or miss a new one. The provider is chosen by
``CHECKBEAT_TENANTS_PROVIDER``: ``auto`` (a function registered with :func:`tenants_provider`,
else the Redis set), ``redis`` (the set managed by ``celery -A celery_app tenants add|rm|list``),
``none`` (per-tenant tasks do not fire and diagnose says so) or a dotted path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import redis
from celery import Celery

from celery_app.errors import CheckbeatError
from celery_app.factory import settings_of
from celery_app.names import TENANT_RULE, is_tenant
from celery_app.redis.client import get_redis
from celery_app.redis.keyspace import state_keys
from celery_app.redis.schema import Keys
from celery_app.registry import TENANTS, THE_PROVIDER, declaring_registry, origin_of, registry_of

TenantsFn = Callable[[], Iterable[str]]


class TenantError(CheckbeatError, ValueError):
    """A tenant name is not allowed; the message says what is."""


def validate_tenant(name: str) -> str:
    """Tenant names become key components, so ``:``, ``|``, spaces and control characters are
    refused; the rule is :data:`celery_app.names.TENANT_RULE`, the same as a check's tenant."""
    if not is_tenant(name):
        raise TenantError(f"tenant {name!r} is not allowed: use {TENANT_RULE}")
    return name


def tenants_provider(fun: TenantsFn | None = None, *, app: Celery | None = None) -> object:
    """Register the function that lists the active tenants (``@tenants_provider``).

    It is called once per window and returns an iterable of tenant names. Without ``app`` it is
    shared: every app uses it, including one built after the import (``checkbeat up``'s). With
    ``app`` only that app does, in place of a shared one (a test app brings its own).
    """

    def register(f: TenantsFn) -> TenantsFn:
        declaring_registry(app).add(TENANTS, THE_PROVIDER, f, origin_of(f))
        return f

    return register(fun) if fun is not None else register


def unregister_tenants_provider(*, app: Celery | None = None) -> None:
    """Forget the registered provider (tests): the shared one unless ``app`` is given."""
    declaring_registry(app).remove(TENANTS, THE_PROVIDER)


@dataclass(frozen=True)
class TenantsSource:
    """The resolved provider: ``read()`` lists the tenants, ``describe`` says where from."""

    describe: str
    read: TenantsFn


def redis_tenants(client: redis.Redis, keys: Keys) -> TenantsFn:
    def read() -> list[str]:
        return sorted(cast("set[str]", client.smembers(keys.tenants())))  # decode_responses=True

    return read


def _import_path(path: str) -> TenantsFn:
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    try:
        fun = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise TenantError(f"CHECKBEAT_TENANTS_PROVIDER={path!r} cannot be imported: {exc}") from exc
    if not callable(fun):
        raise TenantError(f"CHECKBEAT_TENANTS_PROVIDER={path!r} is not callable")
    return cast("Callable[[], Iterable[str]]", fun)  # callable; each read checks what it yields


def resolve_tenants(app: Celery) -> TenantsSource | None:
    """The app's tenants source, or None when per-tenant tasks must not fire."""
    settings = settings_of(app)
    choice = settings.tenants_provider
    keys = state_keys(settings)
    if choice == "none":
        return None
    if choice == "auto":
        registered = registry_of(app).get(TENANTS, THE_PROVIDER)
        if registered is not None:
            return TenantsSource(f"@tenants_provider {registered.origin}", registered.value)
    elif choice != "redis":
        return TenantsSource(choice, _import_path(choice))
    client = get_redis(settings.redis_url, settings)
    return TenantsSource("redis set " + keys.tenants(), redis_tenants(client, keys))


def read_tenants(source: TenantsSource) -> list[str]:
    """Call the provider and validate what it returns (a bad name fails the read, loudly)."""
    names = [validate_tenant(str(t)) for t in source.read()]
    return sorted(set(names))
