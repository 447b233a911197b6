"""The state part of ``checkbeat status --json`` and of the live view: each check's state, its
regions' states, and the newest transitions."""

from __future__ import annotations

import time

from rich.console import Console
from support.health import run_once

from celery_app.local.status import collect_status
from celery_app.local.view import render


def test_status_and_view_show_states_and_transitions(r, keys, store, dispatcher_app):
    for uid in ("a", "b"):
        store.create(
            uid=uid, tenant="acme", kind="testprobe", target="x", period=60,
            regions=["eu", "us"], failure_threshold=1, quorum=1,
        )  # fmt: skip
    run_once(r, keys, store.settings, store.params, "a@eu", False, time.time())
    status = collect_status(dispatcher_app)
    states = {s["uid"]: s for s in status["states"]}
    assert states["a"]["state"] == "down" and states["a"]["transitions"] == 1
    assert states["b"]["state"] == "up" and states["b"]["since"] is None
    assert [(t["uid"], t["from"], t["to"]) for t in status["transitions"]] == [("a", "up", "down")]
    assert status["undelivered"] == 1  # no worker delivered it in this test
    rows = {(c["uid"], c["region"]): c["region_state"] for c in status["checks"]}
    assert rows[("a", "eu")] == "down" and rows[("a", "us")] == "up"
    console = Console(record=True, width=160)
    console.print(render(status))
    text = console.export_text()
    assert "1 of 2 checks up" in text and "up -> down" in text
