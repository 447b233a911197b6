"""Fixtures of the cron/beat tests (a plugin listed in tests/conftest.py).

Their helpers (``T0``, ``make_engine``, ``sends``, ...) are in :mod:`support.cron`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_app.factory import create_app
from celery_app.settings import load_settings


@pytest.fixture
def cron_app(r: redis.Redis, broker_url: str) -> Iterator[Celery]:
    """A fresh app (its own task registry) on empty state and broker dbs."""
    redis.Redis.from_url(broker_url).flushdb()
    app = create_app(load_settings())
    yield app
    app.close()
