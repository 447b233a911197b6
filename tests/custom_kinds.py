"""User check kinds for the tests, loaded by workers through CHECKBEAT_IMPORTS=custom_kinds.

``sleepy`` is a user function registered like the built-ins: it sleeps ``seconds``. With
``stubborn`` it swallows Celery's soft time limit and keeps sleeping, so only the hard limit (or
a kill) ends it: a misbehaving probe. ``announced`` creates a file when it starts.
``malformed`` returns a result whose detail is not a mapping: the run fails after its probe,
while its outcome is built.
"""

from __future__ import annotations

import time
from pathlib import Path

from celery.exceptions import SoftTimeLimitExceeded

from celery_app.checks.kinds import check_kind
from celery_app.errors import CheckFieldError
from workers.probes.result import ProbeResult


def validate_sleepy(target: str, config: dict) -> dict:
    seconds = config.get("seconds", 0.01)
    if not isinstance(seconds, int | float) or seconds < 0:
        raise CheckFieldError("config.seconds", f"must be a number >= 0, got {seconds!r}")
    return {"seconds": float(seconds), "stubborn": bool(config.get("stubborn", False))}


@check_kind("sleepy", validate=validate_sleepy)
def sleepy(target: str, config: dict) -> bool:
    try:
        time.sleep(config["seconds"])
    except SoftTimeLimitExceeded:
        if not config["stubborn"]:
            raise
        time.sleep(600)
    return True


@check_kind("announced", validate=validate_sleepy)
def announced(target: str, config: dict) -> bool:
    """``sleepy`` that first creates the file ``target``: a test knows the probe has started
    (the worker read its job) without guessing a delay."""
    Path(target).touch()
    time.sleep(config["seconds"])
    return True


@check_kind("malformed", validate=validate_sleepy)
def malformed(target: str, config: dict) -> ProbeResult:
    """A user kind's bug the type checker would catch: ``detail`` must be a mapping."""
    return ProbeResult(True, 1.0, detail=["not", "a", "mapping"])
