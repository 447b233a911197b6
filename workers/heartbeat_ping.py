"""The ``checkbeat.heartbeat_ping`` task: a ping of a heartbeat check sent from any Celery app
(``app.send_task("checkbeat.heartbeat_ping", kwargs={"uid": ...})``), run by a checkbeat
worker. A refused ping (unknown check, bad value) is logged and dropped: retrying would not
make it valid."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from celery_app.checks.heartbeat import PING_TASK, PingRefused, ping

log = logging.getLogger(__name__)


@shared_task(name=PING_TASK, bind=True, ignore_result=True)
def heartbeat_ping(
    self: Any,
    uid: str,
    kind: str = "success",
    exit_status: int | None = None,
    duration_s: float | None = None,
    body: str = "",
) -> None:
    try:
        ping(self.app, uid, kind, exit_status=exit_status, duration_s=duration_s, body=body)
    except PingRefused as exc:
        log.error("checkbeat: heartbeat ping %s refused: %s", self.request.id, exc)
