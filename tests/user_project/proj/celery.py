"""The project's app: its own name, broker and routes, with checkbeat set through app.conf."""

import os
from datetime import timedelta

from celery import Celery

import celery_app as checkbeat

app = Celery("proj", broker=os.environ["PROJ_BROKER_URL"])
app.conf.imports = ["proj.tasks"]
app.conf.task_routes = {"proj.tasks.hello": {"queue": "proj-hello"}}
app.conf.timezone = "Europe/Berlin"

app.conf.checkbeat_key_prefix = os.environ["PROJ_KEY_PREFIX"]
app.conf.checkbeat_regions = ["eu", "us"]
app.conf.checkbeat_cron_grace = timedelta(seconds=30)

checkbeat.install(app)
