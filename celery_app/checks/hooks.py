"""``@on_transition``: register user code that receives every transition of a check's state.

A hook is a function of one :class:`~celery_app.checks.transitions.Transition`. It runs inside
the ``checkbeat.deliver_transition`` Celery task on a worker consuming
``CHECKBEAT_TRANSITION_QUEUE``, once per transition (see :mod:`celery_app.checks.transitions`);
if it raises, the queue retries the delivery (every hook runs again: use ``transition.id`` as
the idempotency key of whatever the hook sends). Without ``app=`` the hook is shared by every
app, like ``@cron``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from celery_app.registry import HOOKS, declaring_registry, origin_of

if TYPE_CHECKING:
    from celery import Celery

F = TypeVar("F", bound=Callable[..., Any])


def on_transition(
    fn: F | None = None, *, name: str | None = None, app: Celery | None = None
) -> Any:
    """Register ``fn`` as a transition hook (``@on_transition`` or ``@on_transition(name=...)``;
    the name defaults to ``module.qualname``)."""

    def register(f: F) -> F:
        origin = origin_of(f)
        declaring_registry(app).add(HOOKS, name or origin, f, origin)
        return f

    return register(fn) if fn is not None else register
