"""The project's app: checkbeat's one line for cron tasks and ``install`` for checks."""

import os

from celery import Celery

import celery_app as checkbeat

app = Celery("proj", broker=os.environ["PROJ_BROKER_URL"])
app.conf.imports = ["proj.tasks"]
app.conf.beat_scheduler = "beat:CronScheduler"
app.conf.beat_schedule = {"ping": {"task": "proj.tasks.ping", "schedule": 2.0}}

app.conf.checkbeat_key_prefix = os.environ["PROJ_KEY_PREFIX"]
app.conf.checkbeat_regions = ["eu"]
app.conf.checkbeat_allow_private_targets = True  # the project's own service is on 127.0.0.1

checkbeat.install(app)
