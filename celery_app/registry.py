"""One registry for what user code declares: check kinds, cron tasks, the tenants provider and
the transition hooks (``@on_transition``).

Why one: an app built after the declarations, like the one ``checkbeat up`` builds with
``fresh_app()``, must see a ``@tenants_provider`` registered at import; a declaration kept in a
module dict or on whichever app was current at import would be lost to it.

Two scopes, the pattern of Celery's ``shared_task``: a decorator without ``app=`` (``@check_kind``,
``@cron``, ``@tenants_provider``) writes a *shared* entry that the registry of every app includes,
whether the app was built before or after the declaration; with ``app=`` it writes to that app's
registry only, and that entry shadows a shared one of the same name (a test app may bring its own
tenants provider). Readers always go through :func:`registry_of` of the app in hand.

A name is registered once per registry: the same function again (a re-import) is fine, another
function under the same name is an error, since results would depend on import order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from celery_app.errors import CheckbeatError

if TYPE_CHECKING:
    from celery import Celery

    from celery_app.checks.kinds import CheckKind
    from celery_app.cron_tasks.registration import CronDeclaration

#: The sections of a registry, named as error messages name them.
KINDS: Final = "check kind"
CRON: Final = "cron task"
TENANTS: Final = "tenants provider"
HOOKS: Final = "transition hook"
SECTIONS: Final = (KINDS, CRON, TENANTS, HOOKS)
#: The tenants section holds a single entry, under this name.
THE_PROVIDER: Final = "tenants"

_APP_ATTRIBUTE = "_checkbeat_registry"


class RegistryConflict(CheckbeatError, ValueError):
    """A name is already registered with a different function; the message names both."""


def origin_of(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function: how a re-import is told from a second definition."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(frozen=True)
class Entry:
    """One registered value and the function it came from."""

    value: Any
    origin: str


class Registry:
    """The entries of one scope, read through to the ``parent`` (the shared registry)."""

    def __init__(self, parent: Registry | None = None) -> None:
        self.parent = parent
        self._sections: dict[str, dict[str, Entry]] = {section: {} for section in SECTIONS}
        self._lock = threading.Lock()

    # --- writing ---------------------------------------------------------------------------
    def add(self, section: str, name: str, value: Any, origin: str) -> None:
        """Register ``value`` as ``name``; RegistryConflict if another function holds it here."""
        with self._lock:
            entries = self._sections[section]
            existing = entries.get(name)
            if existing is not None and existing.origin != origin:
                raise RegistryConflict(
                    f"{section} {name!r} is already registered by {existing.origin}; "
                    f"{origin} cannot register it too"
                )
            entries[name] = Entry(value, origin)

    def remove(self, section: str, name: str) -> None:
        """Forget ``name`` in this scope (tests register throwaway entries)."""
        with self._lock:
            self._sections[section].pop(name, None)

    # --- reading ---------------------------------------------------------------------------
    def entries(self, section: str) -> dict[str, Entry]:
        """Every entry visible here, by name: this scope's own over the parent's."""
        merged = self.parent.entries(section) if self.parent is not None else {}
        with self._lock:
            merged.update(self._sections[section])
        return merged

    def values(self, section: str) -> dict[str, Any]:
        return {name: entry.value for name, entry in sorted(self.entries(section).items())}

    def get(self, section: str, name: str) -> Entry | None:
        with self._lock:
            own = self._sections[section].get(name)
        if own is not None or self.parent is None:
            return own
        return self.parent.get(section, name)

    # typed views of the three sections
    def kinds(self) -> dict[str, CheckKind]:
        return self.values(KINDS)

    def cron_declarations(self) -> Iterable[CronDeclaration]:
        return self.values(CRON).values()

    def transition_hooks(self) -> dict[str, Callable[..., Any]]:
        """The ``@on_transition`` hooks, by name (they run in this order)."""
        return self.values(HOOKS)


#: What the decorators without ``app=`` register: included in every app's registry.
SHARED: Final = Registry()

_attach_lock = threading.Lock()


def registry_of(app: Celery) -> Registry:
    """The app's registry: its own entries plus the shared ones (created on first use)."""
    registry = getattr(app, _APP_ATTRIBUTE, None)
    if registry is None:
        with _attach_lock:
            registry = getattr(app, _APP_ATTRIBUTE, None)
            if registry is None:
                registry = Registry(parent=SHARED)
                setattr(app, _APP_ATTRIBUTE, registry)
    return registry


def declaring_registry(app: Celery | None) -> Registry:
    """Where a decorator registers: the app's registry with ``app=``, else the shared one."""
    return SHARED if app is None else registry_of(app)
