"""The project's tasks and its transition hook; each run leaves a record in Redis, with the
path checkbeat was imported from."""

import json
import os

import redis

import celery_app
from celery_app import cron, on_transition
from proj.celery import app

PINGS = "proj:pings"
MINUTES = "proj:minutes"
TRANSITIONS = "proj:transitions"


def _record(key: str, **fields: object) -> None:
    client = redis.Redis.from_url(os.environ["PROJ_BROKER_URL"])
    client.rpush(key, json.dumps({**fields, "checkbeat": celery_app.__file__}))


@app.task
def ping() -> None:
    _record(PINGS)


@cron("* * * * *", id="proj-minute", app=app)
def every_minute() -> None:
    _record(MINUTES)


@on_transition(app=app)
def remember(transition) -> None:
    _record(
        TRANSITIONS,
        id=transition.id,
        uid=transition.uid,
        from_state=transition.from_state,
        to_state=transition.to_state,
    )
