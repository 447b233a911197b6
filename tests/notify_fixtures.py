"""Fixtures of the notification tests: real receivers on 127.0.0.1 (support.notify_receivers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.notify_receivers import HttpReceiver, SmtpReceiver


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as receiver:
        yield receiver


@pytest.fixture
def smtp_receiver() -> Iterator[SmtpReceiver]:
    with SmtpReceiver() as receiver:
        yield receiver
