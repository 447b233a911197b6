"""What a check or a tenant owns by scope, stored one way: maintenance windows
(``checks/maintenance.py``) and notification targets (``checks/notify.py``).

A scope is ``check:<uid>`` or ``tenant:<tenant>`` (``schema.maintenance_scope``). Each scope's
items are one hash, item id -> the item's JSON, and a set names the scopes that hold any; both
live in the first partition of the check half, whatever partition the keys given name: a
tenant's items belong to no one check, and they are read outside the run's scripts. A store
names its two keys (from ``redis/schema.py``), how an item is read back and, when workers cache
what they read, the version key every write moves (:class:`ScopedKind`).
"""

from __future__ import annotations

import builtins
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from celery_app.errors import CheckFieldError, CheckNotFound
from celery_app.names import ID_RULE, TENANT_RULE, is_id, is_tenant
from celery_app.redis.schema import Keys, maintenance_scope


class ScopedItem(Protocol):
    """An item kept by scope: its id is unique across scopes."""

    @property
    def id(self) -> str: ...

    @property
    def scope(self) -> str: ...

    def to_json(self) -> str: ...


Item = TypeVar("Item", bound=ScopedItem)


def validated_scope(uid: Any, tenant: Any) -> str:
    """The scope of exactly one of a check uid and a tenant, or CheckFieldError naming the
    field (``scope``, ``uid``, ``tenant``) and what is allowed."""
    if (uid is None) == (tenant is None):
        raise CheckFieldError("scope", "give exactly one of a check uid and a tenant")
    if uid is not None and (not isinstance(uid, str) or not is_id(uid)):
        raise CheckFieldError("uid", f"{uid!r} is not allowed: use {ID_RULE}")
    if tenant is not None and (not isinstance(tenant, str) or not is_tenant(tenant)):
        raise CheckFieldError("tenant", f"{tenant!r} is not allowed: use {TENANT_RULE}")
    return maintenance_scope(uid=uid, tenant=tenant)


def validated_id(item_id: Any) -> str:
    """``item_id``, or a new random one when None; CheckFieldError (``id``) when not an id."""
    if item_id is None:
        return secrets.token_hex(4)
    if not isinstance(item_id, str) or not is_id(item_id):
        raise CheckFieldError("id", f"{item_id!r} is not allowed: use {ID_RULE}")
    return item_id


def decode_scope(
    item: Callable[[str, str, str], Item], scope: str, h: Mapping[str, str]
) -> list[Item]:
    """The items of one scope's hash, by id."""
    return [item(item_id, scope, text) for item_id, text in sorted(h.items())]


def read_for_check(
    client: Any,
    key: Callable[[str], str],
    decode: Callable[[str, Mapping[str, str]], list[Item]],
    uid: str,
    tenant: str,
) -> list[Item]:
    """The check's own items, then its tenant's, in one round trip."""
    check_scope = maintenance_scope(uid=uid)
    tenant_scope = maintenance_scope(tenant=tenant) if tenant else None
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(key(check_scope))
    if tenant_scope:
        pipe.hgetall(key(tenant_scope))
    replies = pipe.execute()
    items = decode(check_scope, replies[0])
    if tenant_scope:
        items += decode(tenant_scope, replies[1])
    return items


@dataclass(frozen=True)
class ScopedKind(Generic[Item]):
    """What a store keeps: its keys (``Keys`` methods) and how an item is read back."""

    #: The hash of one scope's items.
    key: Callable[[Keys, str], str]
    #: The set of the scopes that hold items.
    scopes_key: Callable[[Keys], str]
    #: The item stored as JSON text, from its id, its scope and the text.
    item: Callable[[str, str, str], Item]
    #: The key in a partition whose random token every write replaces, so readers may cache
    #: the items until it moves (None: no reader caches them).
    version_key: Callable[[Keys], str] | None = None


class ScopedStore(Generic[Item]):
    """Add, remove and list items; read the items that apply to a check. A subclass sets
    :attr:`kind`."""

    kind: ScopedKind[Item]

    def __init__(self, client: Any, keys: Keys) -> None:
        self.redis = client
        self.keys = keys.at(0)  # items and scopes live in the first partition

    def key(self, scope: str) -> str:
        return self.kind.key(self.keys, scope)

    def scopes_key(self) -> str:
        return self.kind.scopes_key(self.keys)

    def decode(self, scope: str, h: Mapping[str, str]) -> builtins.list[Item]:
        return decode_scope(self.kind.item, scope, h)

    def _bump(self, pipe: Any) -> str | None:
        """Queue a new version in the first partition, in the transaction that writes the
        items; :meth:`_spread` gives the others the same after it."""
        if self.kind.version_key is None:
            return None
        version = secrets.token_hex(8)
        pipe.set(self.kind.version_key(self.keys), version)
        return version

    def _spread(self, version: str | None) -> None:
        """Every other partition's version moves after the items are written: a run that
        reads its partition's version then reads the items never keeps stale ones."""
        if version is None or self.kind.version_key is None:
            return
        for part in self.keys.every_partition()[1:]:
            self.redis.set(self.kind.version_key(part), version)

    def add(self, item: Item) -> Item:
        """Store a validated item; a check scope must name an existing check."""
        if item.scope.startswith("check:"):
            uid = item.scope.split(":", 1)[1]
            if not self.redis.exists(self.keys.check(uid)):
                raise CheckNotFound(uid)
        self.replace_many([], [item])
        return item

    def remove(self, item_id: str) -> bool:
        """Remove the item with this id, whatever its scope; False when there is none."""
        for scope in self.scopes():
            pipe = self.redis.pipeline(transaction=True)
            pipe.hdel(self.key(scope), item_id)
            version = self._bump(pipe)
            pipe.exists(self.key(scope))
            replies = pipe.execute()
            self._spread(version)
            if replies[0]:
                if not replies[-1]:
                    self.redis.srem(self.scopes_key(), scope)
                return True
        return False

    def scopes(self) -> builtins.list[str]:
        return sorted(cast("set[str]", self.redis.smembers(self.scopes_key())))

    def drop_scope(self, scope: str) -> int:
        """Remove every item of ``scope`` (a deleted check's: a check created again under its
        uid must not inherit them); how many there were."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hlen(self.key(scope))
        pipe.delete(self.key(scope))
        pipe.srem(self.scopes_key(), scope)
        count = int(pipe.execute()[0])
        if count:
            self._spread(self._bump(self.redis))
        return count

    def replace_many(self, removes: Iterable[Item], adds: Iterable[Item]) -> None:
        """Remove and add many items in one transaction with one version bump (``checks
        apply``, the move of ``checks reconcile``). Unlike :meth:`add`, a check scope is not
        looked up: the caller wrote the check first."""
        removes, adds = builtins.list(removes), builtins.list(adds)
        if not (removes or adds):
            return
        pipe = self.redis.pipeline(transaction=True)
        for item in removes:
            pipe.hdel(self.key(item.scope), item.id)
        for item in adds:
            pipe.hset(self.key(item.scope), item.id, item.to_json())
            pipe.sadd(self.scopes_key(), item.scope)
        version = self._bump(pipe)
        emptied = sorted({i.scope for i in removes} - {i.scope for i in adds})
        for scope in emptied:
            pipe.exists(self.key(scope))
        replies = pipe.execute()
        self._spread(version)
        left = replies[len(replies) - len(emptied) :]
        gone = [scope for scope, exists in zip(emptied, left, strict=True) if not exists]
        if gone:
            self.redis.srem(self.scopes_key(), *gone)

    def list(self, scope: str | None = None) -> builtins.list[Item]:
        scopes = [scope] if scope else self.scopes()
        pipe = self.redis.pipeline(transaction=False)
        for s in scopes:
            pipe.hgetall(self.key(s))
        return [i for s, h in zip(scopes, pipe.execute(), strict=True) for i in self.decode(s, h)]

    def for_check(self, uid: str, tenant: str) -> builtins.list[Item]:
        """The check's own items, then its tenant's, in one round trip."""
        return read_for_check(self.redis, self.key, self.decode, uid, tenant)
