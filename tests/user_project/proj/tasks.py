"""The project's tasks: a plain Celery task, a cron task and a check kind of its own."""

from celery_app import cron
from celery_app.checks.kinds import check_kind
from proj.celery import app


@app.task
def hello() -> str:
    return "hello"


@cron("0 3 * * *", id="proj-nightly", app=app)
def nightly() -> str:
    return "done"


def _validate(target: str, config: dict) -> dict:
    if not target.startswith("local:"):
        raise ValueError("target: must start with 'local:'")
    return config


@check_kind("proj-local", validate=_validate, app=app)
def local_probe(target: str, config: dict, context: object) -> bool:
    return True
